"""The config search path: the user's folders first, then the shipped configs, then what plugins ship."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser

import specfamily
from specfamily.core import plugins
from specfamily.eval.config import check_config, drafter_specs
from specfamily.eval.searchpath import (
    SEARCHPATH_KEY,
    as_entry,
    compose,
    configs_dir,
    current_search_path,
    find_config,
    search_path,
    with_search_path,
)

PLUGIN = """
from dataclasses import dataclass
from pathlib import Path

from specfamily.core.hookspecs import hookimpl


@dataclass
class ToyConfig:
    gamma: int | None = None
    policy: str | None = None
    width: int = 1


class ToyDrafter:
    def __init__(self, target, **options):
        self.options = options


@hookimpl
def specfamily_register_drafters(registry):
    registry.register("toy", ToyDrafter, config=ToyConfig, description="a plugin's drafter")


@hookimpl
def specfamily_config_path():
    return ["pkg://toyplug.configs", Path(__file__).parent / "more_configs"]
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    """A plugin package ``toyplug`` (drafter ``toy``) shipping two config folders, registered with the built-ins."""
    _write(tmp_path / "plugin", {
        "toyplug/__init__.py": PLUGIN,
        "toyplug/configs/__init__.py": "",
        "toyplug/configs/drafter/toy.yaml": "name: toy\ngamma: 3\npolicy: null\nwidth: 2\n",
        "toyplug/configs/drafter/small_model.yaml": "name: small_model\ngamma: 99\n",  # must not win
        "toyplug/more_configs/experiment/toy_widths.yaml": """\
            # @package _global_
            defaults:
              - override /drafter: arms
            drafter:
              arms:
                toy:narrow: {}
                toy:wide: {width: 8}
            """,
    })
    monkeypatch.syspath_prepend(str(tmp_path / "plugin"))
    monkeypatch.setattr(plugins, "DEFAULT_PLUGINS", (*plugins.DEFAULT_PLUGINS, "toyplug"))
    plugins.reset_plugins()
    yield tmp_path / "plugin" / "toyplug"
    plugins.reset_plugins()
    for name in [m for m in sys.modules if m == "toyplug" or m.startswith("toyplug.")]:
        del sys.modules[name]


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """A user's config folder: its own small_model file (a shipped name), a new experiment and a copy of config.yaml."""
    primary = (configs_dir() / "config.yaml").read_text().replace("seed: 0", "seed: 7")
    return _write(tmp_path / "mine", {
        "drafter/small_model.yaml": "name: small_model\nmodel: ${model.draft}\ngamma: 2\npolicy: null\n"
                                    "dtype: null\nconfidence: 0.25\n",
        "experiment/short.yaml": "# @package _global_\ndataset:\n  max_new_tokens: 5\n",
        "config.yaml": primary,
    })


def test_shipped_configs_are_the_top_level_folder_in_a_checkout():
    package = Path(specfamily.__file__).parent
    root = configs_dir()
    assert (root / "config.yaml").is_file() and (root / "drafter" / "arms.yaml").is_file()
    if (package.parent / "pyproject.toml").is_file():  # a source checkout: configs/ is the one source
        assert root == package.parent / "configs"
        assert not (package / "configs").exists()
    else:  # an installed package: the build shipped configs/ as specfamily/configs
        assert root == package / "configs"


def test_search_path_is_user_then_shipped_then_plugins(toy_plugin, user_dir):
    shipped = as_entry(configs_dir())
    assert search_path() == [shipped, "pkg://toyplug.configs", as_entry(toy_plugin / "more_configs")]
    assert search_path([user_dir])[:2] == [f"file://{user_dir}", shipped]
    assert as_entry("pkg://x.y") == "pkg://x.y" and as_entry("rel") == f"file://{Path('rel').resolve()}"


def test_a_user_file_with_a_shipped_name_replaces_the_shipped_one(user_dir):
    assert compose(["drafter=small_model"]).drafter.gamma is None
    mine = compose(["drafter=small_model", "experiment=short"], user=[user_dir])
    assert (mine.drafter.gamma, mine.drafter.confidence, mine.dataset.max_new_tokens) == (2, 0.25, 5)
    assert mine.seed == 7  # the user's config.yaml is the primary config


def test_drafter_all_reads_each_drafter_file_through_the_search_path(user_dir):
    overrides = ["drafter.names=[small_model,prompt_lookup]"]
    cfg = compose(overrides, user=[user_dir], return_hydra_config=True)
    assert current_search_path(cfg)[:2] == [f"file://{user_dir}", as_entry(configs_dir())]
    specs = {spec.label: spec.options for spec in drafter_specs(cfg)}
    assert (specs["small_model"]["gamma"], specs["small_model"]["confidence"]) == (2, 0.25)
    assert specs["prompt_lookup"]["max_ngram"] == 3  # the shipped file: the user has none
    shipped = {spec.label: spec.options for spec in drafter_specs(compose(overrides))}
    assert shipped["small_model"]["gamma"] is None


def test_a_plugin_ships_its_drafters_config(toy_plugin):
    cfg = compose(["drafter=toy"])
    assert dict(cfg.drafter) == {"name": "toy", "gamma": 3, "policy": None, "width": 2}
    assert [(s.label, s.options) for s in check_config(cfg)][1] == ("toy", {"gamma": 3, "policy": None, "width": 2})
    every = {spec.label: spec.options for spec in drafter_specs(compose([]))}
    assert every["toy"]["width"] == 2
    assert every["small_model"].get("gamma") is None  # the plugin's small_model.yaml does not shadow the shipped one
    arms = check_config(compose(["experiment=toy_widths"]))  # from the plugin's second folder
    assert [(s.label, s.name, s.options["width"]) for s in arms[1:]] == [
        ("toy:narrow", "toy", 2), ("toy:wide", "toy", 8)]


def test_a_user_file_beats_a_plugins_file(toy_plugin, tmp_path):
    mine = _write(tmp_path / "mine", {"drafter/toy.yaml": "name: toy\nwidth: 5\n"})
    assert compose(["drafter=toy"], user=[mine]).drafter.width == 5


def test_find_config_takes_the_first_entry_that_has_the_file(tmp_path, user_dir):
    entries = ["pkg://hydra.conf", "pkg://not_a_module_anywhere", f"file://{user_dir}", as_entry(configs_dir())]
    assert find_config("drafter", "small_model", entries) == user_dir / "drafter" / "small_model.yaml"
    assert find_config("drafter", "medusa", entries) == configs_dir() / "drafter" / "medusa.yaml"
    assert find_config("drafter", "nowhere", entries) is None


def _parsed(argv: list[str]):
    args = get_args_parser().parse_args(argv)
    searchpath = [o for o in args.overrides if o.startswith(SEARCHPATH_KEY)]
    return args, OverridesParser.create().parse_override(searchpath[0]).value() if searchpath else None


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["drafter=eagle", "--cfg", "job"],
        ["--config-dir", "/some/where", "drafter=eagle", "--cfg", "job"],
        ["--info", "searchpath", "--config-dir=/x", "drafter=eagle"],
        ["--multirun", "drafter.gamma=1,2", "hydra.searchpath=[file:///a,pkg://b.c]", "-c", "job"],
    ],
)
def test_the_composed_search_path_is_one_override_hydra_accepts(argv):
    args, entries = _parsed(with_search_path(argv))
    user = ["file:///a", "pkg://b.c"] if any(a.startswith(SEARCHPATH_KEY) for a in argv) else []
    assert entries == [*user, *search_path()]
    assert [o for o in args.overrides if not o.startswith(SEARCHPATH_KEY)] == [
        a for a in argv if "=" in a and not a.startswith(("-", SEARCHPATH_KEY))]


def test_odd_folder_names_survive_the_override(tmp_path):
    odd = tmp_path / "my configs, v2"
    odd.mkdir()
    _, entries = _parsed(with_search_path([f"hydra.searchpath=['{odd}']"]))
    assert entries[0] == f"file://{odd}"


def _built_wheel(checkout: Path, tmp_path: Path) -> Path:
    """``$SPECFAMILY_WHEEL`` (a wheel CI built with ``pip wheel . --no-deps``), else one built here from a copy."""
    import shutil
    import subprocess

    given = os.environ.get("SPECFAMILY_WHEEL")
    if given:
        return Path(given)
    source = tmp_path / "src"
    shutil.copytree(checkout, source, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "-w", str(tmp_path / "wheel"), "--no-deps",
                    "--no-build-isolation", "-q"], check=True, capture_output=True, timeout=600)
    return next((tmp_path / "wheel").glob("*.whl"))


@pytest.mark.slow
@pytest.mark.wheel
def test_a_wheel_ships_the_top_level_configs_inside_the_package(tmp_path):
    """A real non-editable build (setup.py maps configs/ to specfamily/configs): every config file is in the wheel,
    and so are the zoo's weights and the stream kernel's source (package data a user needs at run time)."""
    import zipfile

    checkout = Path(__file__).resolve().parents[2]  # this test's source tree, wherever specfamily is imported from
    assert (checkout / "setup.py").is_file() and (checkout / "configs").is_dir(), checkout
    names = set(zipfile.ZipFile(_built_wheel(checkout, tmp_path)).namelist())
    shipped = {f"specfamily/configs/{p.relative_to(checkout / 'configs').as_posix()}"
               for p in (checkout / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert not [name for name in names if name.startswith("configs/")]  # no stray top-level package
    data = {p.relative_to(checkout).as_posix() for pattern in ("*.safetensors", "*.cpp")
            for p in (checkout / "specfamily").rglob(pattern)}
    assert data and data <= names, sorted(data - names)
