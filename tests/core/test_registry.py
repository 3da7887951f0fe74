"""DrafterRegistry: registration, lookup with suggestions, option validation, docs rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from specfamily.core.registry import DrafterInfo, DrafterRegistry


@dataclass
class ToyConfig:
    gamma: int = 4
    policy: str = "constant"
    weights: str | None = None

    def __post_init__(self) -> None:
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")


@dataclass
class ListConfig:
    model: str
    sizes: list[int] = field(default_factory=lambda: [1, 2])


class ToyDrafter:
    def __init__(self, target: object, **options: object) -> None:
        self.target = target
        self.options = options


@pytest.fixture
def registry() -> DrafterRegistry:
    reg = DrafterRegistry()
    reg.register("small_model", ToyDrafter, config=ToyConfig, description="an independent small LM")
    reg.register("prompt_lookup", ToyDrafter, config=ToyConfig, description="n-gram copy")
    reg.register("medusa", ToyDrafter)
    return reg


def test_names_sorted(registry: DrafterRegistry) -> None:
    assert registry.names() == ["medusa", "prompt_lookup", "small_model"]
    assert "medusa" in registry and "eagle" not in registry
    assert len(registry) == 3


def test_duplicate_name_is_an_error(registry: DrafterRegistry) -> None:
    with pytest.raises(ValueError, match=r"^drafter 'medusa' is already registered$"):
        registry.register("medusa", ToyDrafter)


def test_register_rejects_bad_arguments() -> None:
    reg = DrafterRegistry()
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("", ToyDrafter)
    with pytest.raises(TypeError, match="must be callable"):
        reg.register("x", "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a dataclass type"):
        reg.register("x", ToyDrafter, config=dict)
    with pytest.raises(TypeError, match="must be a dataclass type"):
        reg.register("x", ToyDrafter, config=ToyConfig())  # type: ignore[arg-type]
    assert reg.names() == []


def test_unknown_name_suggests_nearest(registry: DrafterRegistry) -> None:
    with pytest.raises(ValueError) as info:
        registry.create("smal_model", None)
    assert str(info.value) == (
        "unknown drafter 'smal_model'; did you mean 'small_model'? known: medusa, prompt_lookup, small_model"
    )


def test_unknown_name_without_close_match(registry: DrafterRegistry) -> None:
    with pytest.raises(ValueError) as info:
        registry.config_class("xyz")
    assert str(info.value) == "unknown drafter 'xyz'; known: medusa, prompt_lookup, small_model"


def test_unknown_name_in_empty_registry() -> None:
    with pytest.raises(ValueError) as info:
        DrafterRegistry().create("eagle", None)
    assert str(info.value) == "unknown drafter 'eagle'; known: (none)"


def test_unhashable_name_is_a_value_error(registry: DrafterRegistry) -> None:
    with pytest.raises(ValueError, match="unknown drafter"):
        registry.entry(["small_model"])  # type: ignore[arg-type]


def test_create_passes_options_as_given(registry: DrafterRegistry) -> None:
    target = object()
    drafter = registry.create("small_model", target, gamma=6)
    assert isinstance(drafter, ToyDrafter)
    assert drafter.target is target
    assert drafter.options == {"gamma": 6}
    assert registry.create("small_model", target).options == {}


def test_name_and_target_are_positional_only(registry: DrafterRegistry) -> None:
    """An option may be called ``name`` without clashing with the drafter name."""
    registry.register("free", ToyDrafter)
    assert registry.create("free", None, name="x").options == {"name": "x"}


def test_unknown_option_key(registry: DrafterRegistry) -> None:
    with pytest.raises(TypeError) as info:
        registry.create("small_model", None, gama=3)
    assert str(info.value) == (
        "drafter 'small_model' got unknown option 'gama'; did you mean 'gamma'? valid options: gamma, policy, weights"
    )


def test_unknown_option_key_without_close_match(registry: DrafterRegistry) -> None:
    with pytest.raises(TypeError) as info:
        registry.create("small_model", None, zzz=1)
    assert str(info.value) == "drafter 'small_model' got unknown option 'zzz'; valid options: gamma, policy, weights"


def test_several_unknown_option_keys(registry: DrafterRegistry) -> None:
    with pytest.raises(TypeError) as info:
        registry.create("small_model", None, gama=3, zzz=1, gamma=2)
    assert str(info.value) == (
        "drafter 'small_model' got unknown options 'gama' (did you mean 'gamma'?), 'zzz'; "
        "valid options: gamma, policy, weights"
    )


def test_schema_checks_raise_value_error(registry: DrafterRegistry) -> None:
    with pytest.raises(ValueError, match="gamma must be >= 1, got 0"):
        registry.create("small_model", None, gamma=0)


def test_validate_returns_config(registry: DrafterRegistry) -> None:
    assert registry.validate("small_model", gamma=5) == ToyConfig(gamma=5)
    assert registry.validate("medusa", anything=1) is None


def test_no_schema_accepts_any_option(registry: DrafterRegistry) -> None:
    assert registry.create("medusa", None, anything=1).options == {"anything": 1}


def test_config_class(registry: DrafterRegistry) -> None:
    assert registry.config_class("small_model") is ToyConfig
    assert registry.config_class("medusa") is None


def test_describe_rows(registry: DrafterRegistry) -> None:
    registry.register("listy", ToyDrafter, config=ListConfig)
    assert registry.describe() == [
        DrafterInfo("listy", "", ("model", "sizes=[1, 2]")),
        DrafterInfo("medusa", "", ()),
        DrafterInfo("prompt_lookup", "n-gram copy", ("gamma=4", "policy='constant'", "weights=None")),
        DrafterInfo("small_model", "an independent small LM", ("gamma=4", "policy='constant'", "weights=None")),
    ]
