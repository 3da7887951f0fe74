"""Config-time checks of drafter option values against the types their schema dataclasses declare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from specfamily.core.plugins import get_registry
from specfamily.eval.options import OptionError, check_option_values, check_policy


@dataclass
class Schema:
    gamma: int | None = None
    policy: str | None = None
    confidence: float = 0.0
    flag: bool = False
    mode: str = "tree"
    weights: Any = None
    tree: list[int] | None = None


@pytest.mark.parametrize(
    "options",
    [
        {"gamma": 4, "policy": "heuristic", "confidence": 0.5, "flag": True, "mode": "chain"},
        {"gamma": None, "policy": None, "confidence": 1},  # an integer is a number
        {"weights": object(), "tree": "anything"},  # Any and non-plain annotations are the drafter's to check
        {"unknown_key": "abc"},  # unknown keys are the registry's error, not this check's
    ],
)
def test_values_of_the_declared_types_pass(options):
    check_option_values(Schema, options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"confidence": "abc"}, "confidence must be a number, got 'abc'"),
        ({"gamma": 4.5}, "gamma must be an integer or null, got 4.5"),
        ({"gamma": "4"}, "gamma must be an integer or null, got '4'"),
        ({"gamma": True}, "gamma must be an integer or null, got True"),
        ({"confidence": None}, "confidence must be a number, got None"),
        ({"flag": "yes"}, "flag must be true or false, got 'yes'"),
        ({"flag": 1}, "flag must be true or false, got 1"),
        ({"mode": 3}, "mode must be a string, got 3"),
        ({"policy": "fastest"}, "policy must be one of auto, constant, heuristic, optimal or null, got 'fastest'"),
        ({"policy": 3}, "policy must be a string or null, got 3"),
    ],
)
def test_values_of_another_type_name_the_key(options, message):
    with pytest.raises(OptionError) as info:
        check_option_values(Schema, options)
    assert str(info.value) == message
    assert info.value.key == next(iter(options))


@pytest.mark.parametrize("policy", ["auto", "constant", "heuristic", "optimal", None])
def test_every_policy_name_passes(policy):
    check_policy(policy)


def test_unresolvable_annotations_are_not_checked():
    @dataclass
    class Late:
        gamma: NotImportedAnywhere = None  # noqa: F821 (the annotation is a string never resolved)

    check_option_values(Late, {"gamma": "abc"})


@pytest.mark.parametrize(
    ("name", "options", "key"),
    [
        ("small_model", {"confidence": "abc"}, "confidence"),
        ("small_model", {"policy": "fastest"}, "policy"),
        ("prompt_lookup", {"gamma": 2.5}, "gamma"),
        ("medusa", {"typical": "yes"}, "typical"),
        ("hydra", {"share_lm_head": "yes"}, "share_lm_head"),
        ("small_model", {"quantize": "8"}, "quantize"),
        ("eagle", {"top_k": "8"}, "top_k"),
        ("self_spec", {"exit_threshold": "high"}, "exit_threshold"),
        ("lookahead", {"window": "4"}, "window"),
    ],
)
def test_every_registered_schema_is_checked(name, options, key):
    with pytest.raises(OptionError, match=f"^{key} must be"):
        check_option_values(get_registry().config_class(name), options)
