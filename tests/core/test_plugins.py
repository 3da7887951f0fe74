"""The pluggy host: built-ins, third-party entry points from a real distribution, laziness, rebuild."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specfamily.core import plugins

PLUGIN_SOURCE = """
from dataclasses import dataclass

from specfamily.core.hookspecs import hookimpl

CALLS = []


@dataclass
class Config:
    gamma: int = 3


class Drafter:
    def __init__(self, target, **options):
        self.target = target
        self.options = options


@hookimpl
def specfamily_register_drafters(registry):
    CALLS.append(registry)
    registry.register({name!r}, Drafter, config=Config, description="from {module}")
"""

WriteModule = Callable[..., Path]


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with no cached manager and with entry-point autoload off."""
    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "1")
    plugins.reset_plugins()
    yield
    plugins.reset_plugins()


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteModule]:
    """Write importable modules into tmp_path (on sys.path); they leave sys.modules afterwards."""
    written: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(module: str, source: str | None = None, drafter: str | None = None) -> Path:
        if source is None:
            source = PLUGIN_SOURCE.format(name=drafter or module, module=module)
        path = tmp_path / f"{module}.py"
        path.write_text(textwrap.dedent(source))
        written.append(module)
        return path

    yield write
    for module in written:
        sys.modules.pop(module, None)


def use_builtins(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    monkeypatch.setattr(plugins, "DEFAULT_PLUGINS", names)


def test_import_builds_nothing() -> None:
    code = textwrap.dedent(
        """
        import sys
        import specfamily.core.plugins as p
        assert not p.is_built(), "plugin manager built at import time"
        loaded = [m for m in sys.modules if m.startswith("specfamily.drafters.")]
        assert not loaded, loaded
        p.get_plugin_manager()
        assert p.is_built()
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtins_load_on_first_use(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="fake")
    use_builtins(monkeypatch, "sf_builtin_a")
    assert not plugins.is_built()
    assert "sf_builtin_a" not in sys.modules
    assert plugins.list_drafters() == ["fake"]
    assert plugins.is_built()
    pm = plugins.get_plugin_manager()
    assert pm.get_plugin("sf_builtin_a") is sys.modules["sf_builtin_a"]


def test_missing_builtins_are_skipped(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="fake")
    use_builtins(monkeypatch, "sf_not_written_yet", "sf_builtin_a", "sf_missing_pkg.sub", "specfamily.drafters.nope")
    assert plugins.list_drafters() == ["fake"]


def test_real_builtin_modules_build() -> None:
    """The shipped DEFAULT_PLUGINS build a manager; packages that do not exist yet are skipped."""
    pm = plugins.get_plugin_manager()
    registered = {name for name, _ in pm.list_name_plugin()}
    assert registered <= set(plugins.DEFAULT_PLUGINS)


def test_missing_dependency_of_a_builtin_propagates(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_broken_dep", source="import sf_dependency_that_is_not_installed\n")
    use_builtins(monkeypatch, "sf_broken_dep")
    with pytest.raises(ModuleNotFoundError, match="sf_dependency_that_is_not_installed"):
        plugins.get_plugin_manager()
    assert not plugins.is_built()


def test_import_error_of_a_builtin_propagates(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_broken_import", source="raise ImportError('broken on purpose')\n")
    use_builtins(monkeypatch, "sf_broken_import")
    with pytest.raises(ImportError, match="broken on purpose"):
        plugins.get_registry()


def test_hook_runs_once_and_registry_is_cached(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="fake")
    use_builtins(monkeypatch, "sf_builtin_a")
    registry = plugins.get_registry()
    plugins.list_drafters()
    plugins.create_drafter("fake", None)
    assert plugins.get_registry() is registry
    assert sys.modules["sf_builtin_a"].CALLS == [registry]


def test_rebuild(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="fake")
    write_module("sf_builtin_b", drafter="other")
    use_builtins(monkeypatch, "sf_builtin_a")
    first_pm, first_registry = plugins.get_plugin_manager(), plugins.get_registry()
    assert plugins.list_drafters() == ["fake"]

    use_builtins(monkeypatch, "sf_builtin_a", "sf_builtin_b")
    assert plugins.list_drafters() == ["fake"]  # cached until rebuilt
    pm = plugins.rebuild_plugin_manager()
    assert pm is not first_pm and pm is plugins.get_plugin_manager()
    assert plugins.get_registry() is not first_registry
    assert plugins.list_drafters() == ["fake", "other"]

    plugins.reset_plugins()
    assert not plugins.is_built()


def test_duplicate_name_across_plugins(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="same")
    write_module("sf_builtin_b", drafter="same")
    use_builtins(monkeypatch, "sf_builtin_a", "sf_builtin_b")
    with pytest.raises(ValueError, match="^drafter 'same' is already registered$"):
        plugins.get_registry()


def test_create_drafter_and_errors(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="prompt_lookup")
    use_builtins(monkeypatch, "sf_builtin_a")
    target = object()
    drafter = plugins.create_drafter("prompt_lookup", target, gamma=5)
    assert drafter.target is target and drafter.options == {"gamma": 5}
    with pytest.raises(ValueError) as info:
        plugins.create_drafter("prompt_lokup", target)
    assert str(info.value) == "unknown drafter 'prompt_lokup'; did you mean 'prompt_lookup'? known: prompt_lookup"
    with pytest.raises(TypeError) as type_info:
        plugins.create_drafter("prompt_lookup", target, gamm=5)
    assert str(type_info.value) == (
        "drafter 'prompt_lookup' got unknown option 'gamm'; did you mean 'gamma'? valid options: gamma"
    )
    assert [row.name for row in plugins.describe_drafters()] == ["prompt_lookup"]


@pytest.fixture
def installed_toy_plugin(tmp_path: Path, write_module: WriteModule) -> Path:
    """A real distribution ``myplug`` on sys.path whose entry point (group ``specfamily``) registers 'toy'."""
    write_module("myplug", drafter="toy")
    dist_info = tmp_path / "myplug-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[specfamily]\nmyplug = myplug\n")
    return dist_info


def test_third_party_entry_point(
    monkeypatch: pytest.MonkeyPatch, write_module: WriteModule, installed_toy_plugin: Path
) -> None:
    write_module("sf_builtin_a", drafter="fake")
    use_builtins(monkeypatch, "sf_builtin_a")
    monkeypatch.delenv(plugins.DISABLE_AUTOLOAD_ENV)
    plugins.rebuild_plugin_manager()

    assert plugins.list_drafters() == ["fake", "toy"]
    drafter = plugins.create_drafter("toy", "target", gamma=2)
    assert type(drafter).__module__ == "myplug"
    assert drafter.options == {"gamma": 2}
    dists = [dist.metadata["name"] for _, dist in plugins.get_plugin_manager().list_plugin_distinfo()]
    assert dists == ["myplug"]


def test_a_plugin_that_fails_to_import_is_named_and_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, write_module: WriteModule, installed_toy_plugin: Path
) -> None:
    """A second distribution whose module imports a missing package: a warning naming it, the others still load."""
    (tmp_path / "brokenplug.py").write_text("import a_dependency_that_is_not_installed\n")
    dist_info = tmp_path / "brokenplug-2.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 2.0\n")
    (dist_info / "entry_points.txt").write_text("[specfamily]\nbroken = brokenplug\n")
    write_module("sf_builtin_a", drafter="fake")
    use_builtins(monkeypatch, "sf_builtin_a")
    monkeypatch.delenv(plugins.DISABLE_AUTOLOAD_ENV)
    with pytest.warns(RuntimeWarning) as caught:
        plugins.rebuild_plugin_manager()
    message = str(caught[0].message)
    assert "'broken' (brokenplug) from brokenplug 2.0 failed to import and is skipped" in message
    assert "ModuleNotFoundError" in message and "a_dependency_that_is_not_installed" in message
    assert plugins.list_drafters() == ["fake", "toy"]


def test_empty_disable_variable_keeps_autoload(monkeypatch: pytest.MonkeyPatch, installed_toy_plugin: Path) -> None:
    use_builtins(monkeypatch)
    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "")
    assert "toy" in plugins.list_drafters()


def test_disable_autoload_keeps_builtins(
    monkeypatch: pytest.MonkeyPatch, write_module: WriteModule, installed_toy_plugin: Path
) -> None:
    write_module("sf_builtin_a", drafter="fake")
    use_builtins(monkeypatch, "sf_builtin_a")
    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "1")
    plugins.rebuild_plugin_manager()

    assert plugins.list_drafters() == ["fake"]
    assert "myplug" not in sys.modules
    with pytest.raises(ValueError, match="unknown drafter 'toy'"):
        plugins.create_drafter("toy", None)


CONFIG_PATH_SOURCE = """
from specfamily.core.hookspecs import hookimpl


@hookimpl
def specfamily_config_path():
    return {paths!r}
"""


def test_plugins_config_folders_are_collected(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_builtin_a", drafter="fake")  # registers a drafter, ships no configs
    write_module("sf_configs_a", source=CONFIG_PATH_SOURCE.format(paths="/plugins/a/configs"))
    write_module("sf_configs_b", source=CONFIG_PATH_SOURCE.format(paths=["pkg://b.configs", "/plugins/a/configs"]))
    write_module("sf_configs_none", source=CONFIG_PATH_SOURCE.format(paths=None))
    use_builtins(monkeypatch, "sf_builtin_a", "sf_configs_a", "sf_configs_b", "sf_configs_none")
    paths = plugins.plugin_config_paths()
    assert sorted(paths) == ["/plugins/a/configs", "pkg://b.configs"]  # every folder once
    assert plugins.list_drafters() == ["fake"]


def test_a_config_folder_of_another_type_is_refused(monkeypatch: pytest.MonkeyPatch, write_module: WriteModule) -> None:
    write_module("sf_configs_bad", source=CONFIG_PATH_SOURCE.format(paths=3))
    use_builtins(monkeypatch, "sf_configs_bad")
    with pytest.raises(TypeError, match="specfamily_config_path must return folders or search-path strings, got 3"):
        plugins.plugin_config_paths()


def test_an_entry_point_plugin_ships_its_drafters_config(installed_toy_plugin: Path, tmp_path: Path) -> None:
    """``specfamily drafter=toy`` composes the config a third-party plugin ships (a real distribution, a subprocess)."""
    (tmp_path / "myplug_configs" / "drafter").mkdir(parents=True)
    (tmp_path / "myplug_configs" / "drafter" / "toy.yaml").write_text("name: toy\ngamma: 5\n")
    module = tmp_path / "myplug.py"
    module.write_text(module.read_text() + textwrap.dedent(f"""
        @hookimpl
        def specfamily_config_path():
            return {str(tmp_path / "myplug_configs")!r}
        """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    env.pop(plugins.DISABLE_AUTOLOAD_ENV, None)
    done = subprocess.run([sys.executable, "-m", "specfamily.cli", "drafter=toy", "--cfg", "job"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "drafter:\n  name: toy\n  gamma: 5\n" in done.stdout
