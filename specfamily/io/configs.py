"""Where the shipped Hydra configs are on disk (runs' groups and ``train/``), for every layer that reads them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def configs_dir() -> Path:
    """The folder of the shipped Hydra configs: ``specfamily/configs`` when installed, else the checkout's ``configs/``.

    The build ships the top-level ``configs/`` inside the package (setup.py); a source checkout on
    ``sys.path`` (an editable install, ``python -m`` from the checkout) reads ``configs/`` beside the package.
    """
    package = resources.files("specfamily")
    if isinstance(package, Path):
        for folder in (package / "configs", package.parent / "configs"):
            if (folder / "config.yaml").is_file():
                return folder
    raise FileNotFoundError("specfamily's configs are not on disk: no specfamily/configs, no checkout's configs/")
