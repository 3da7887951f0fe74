"""Where configs are found: the user's folders first, then the shipped configs, then the plugins' configs.

Hydra takes the first hit in its search path, which ``specfamily`` composes on every start, highest first:
``--config-dir DIR`` and ``hydra.searchpath=[...]`` entries; the shipped configs (:func:`configs_dir`); what plugins
ship through the ``specfamily_config_path`` hook. ``drafter=all`` and labelled arms read ``drafter/<name>.yaml``
through the same path, and the app's primary config is a stub (:data:`ENTRY`) that pulls ``config.yaml`` through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, ListConfig, OmegaConf

from specfamily.io.configs import configs_dir as configs_dir  # re-exported: the shipped configs

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SEARCHPATH_KEY = "hydra.searchpath"
FILE, PKG = "file://", "pkg://"
# Hydra reads the primary config before it applies hydra.searchpath, so the app's primary is this
# stub (a ConfigStore node) whose defaults pull ``config.yaml`` through the composed search path.
ENTRY = "specfamily_entry"


def register_entry() -> str:
    """Store the primary config stub :data:`ENTRY` (``defaults: [_self_, config]``) in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=ENTRY, node={"defaults": ["_self_", "config"]})
    return ENTRY


def as_entry(path: str | Path) -> str:
    """A Hydra search-path entry: ``pkg://`` and ``file://`` strings as they are, a folder as ``file://<absolute>``."""
    text = str(path)
    if "://" in text:
        return text
    return FILE + str(Path(text).expanduser().resolve())


def default_search_path() -> list[str]:
    """The search path without user folders: the shipped configs, then every plugin's configs."""
    from specfamily.core.plugins import plugin_config_paths

    entries = [as_entry(configs_dir()), *(as_entry(p) for p in plugin_config_paths())]
    return list(dict.fromkeys(entries))


def search_path(user: Sequence[str | Path] = ()) -> list[str]:
    """The full search path after Hydra's own ``--config-dir``: the user's entries, then :func:`default_search_path`."""
    return list(dict.fromkeys([*(as_entry(p) for p in user), *default_search_path()]))


def current_search_path(cfg: DictConfig | None = None) -> list[str]:
    """The search path the running app composed with; the default one outside an app.

    Read from Hydra's runtime record (``hydra.runtime.config_sources``): the job's own ``HydraConfig``
    inside the app, else ``cfg.hydra`` when ``cfg`` was composed with ``return_hydra_config=True``.
    """
    from hydra.core.hydra_config import HydraConfig

    node = None
    if cfg is not None and "hydra" in cfg:
        node = OmegaConf.select(cfg, "hydra.runtime.config_sources")
    elif HydraConfig.initialized():
        node = HydraConfig.get().runtime.config_sources
    if not node:
        return default_search_path()
    return [f"{source.schema}://{source.path}" for source in node
            if source.schema in ("file", "pkg") and source.provider != "hydra"]  # not Hydra's own configs


def find_config(group: str, name: str, entries: Sequence[str]) -> Traversable | None:
    """``<group>/<name>.yaml`` from the first search-path entry that has it (None when none has)."""
    for entry in entries:
        folder = _entry_folder(entry)
        if folder is not None and folder.joinpath(group, f"{name}.yaml").is_file():
            return folder.joinpath(group, f"{name}.yaml")
    return None


def load_yaml(file: Traversable) -> DictConfig | ListConfig:
    """A config file found by :func:`find_config` (a file on disk or a package resource)."""
    return OmegaConf.create(file.read_text(encoding="utf-8"))


def _entry_folder(entry: str) -> Traversable | None:
    """The folder a ``file://`` or ``pkg://`` entry names; None for other schemes or a package that is not there."""
    if entry.startswith(FILE):
        return Path(entry[len(FILE):])
    if entry.startswith(PKG):
        module, _, sub = entry[len(PKG):].partition("/")
        try:
            root = resources.files(module)
        except ModuleNotFoundError:
            return None
        return root.joinpath(sub) if sub else root
    return None


def _quote(entry: str) -> str:
    quote = "'" if "'" not in entry else '"'
    if quote in entry:
        raise ValueError(f"a search-path entry cannot hold both quote characters: {entry!r}")
    return f"{quote}{entry}{quote}"


def _is_searchpath(arg: str) -> bool:
    return arg.lstrip("+~").split("=", 1)[0] == SEARCHPATH_KEY


# Hydra's flags that take a value (--info's is optional: one of INFO_CHOICES).
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                "-cd", "--experimental-rerun"}
_INFO_FLAGS, INFO_CHOICES = {"--info", "-i"}, {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def _first_override(argv: Sequence[str]) -> int:
    """Where the overrides start (argparse takes them as one run of positionals); ``len(argv)`` when there are none."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUE_FLAGS or (arg in _INFO_FLAGS and i + 1 < len(argv) and argv[i + 1] in INFO_CHOICES):
            i += 2
        elif arg.startswith("-"):
            i += 1
        else:
            return i
    return len(argv)


def with_search_path(argv: Sequence[str]) -> list[str]:
    """Command-line arguments with one ``hydra.searchpath`` override: the user's entries, shipped, plugins."""
    user = []  # the entries of the command line's hydra.searchpath=[...] overrides
    for arg in filter(_is_searchpath, argv):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        value = OverridesParser.create().parse_override(arg).value()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{SEARCHPATH_KEY} must be a list of folders, got {value!r}")
        user += value
    rest = [arg for arg in argv if not _is_searchpath(arg)]
    entries = ",".join(_quote(entry) for entry in search_path(user))
    slot = _first_override(rest)
    return [*rest[:slot], f"{SEARCHPATH_KEY}=[{entries}]", *rest[slot:]]


def compose(
    overrides: Sequence[str] = (), user: Sequence[str | Path] = (), return_hydra_config: bool = False
) -> DictConfig:
    """The config ``specfamily`` composes for ``overrides`` with the user's folders ``user`` (Hydra's compose API)."""
    from hydra import compose as hydra_compose
    from hydra import initialize

    args = with_search_path([*overrides, *(f"{SEARCHPATH_KEY}=[{_quote(as_entry(p))}]" for p in user)])
    with initialize(config_path=None, version_base=None):
        return hydra_compose(register_entry(), overrides=args, return_hydra_config=return_hydra_config)
