"""What the feature-drafter trainers (eagle, eagle3) share around their loops: the resumable training state (read
without running code, written atomically, restored) and a command line made from a config dataclass.

A trainer's run object carries ``cfg`` (with ``ckpt_path``), ``target``, ``model``, ``optimizer``, ``generator``,
``scaler``, ``state`` (a dataclass), ``best`` and ``ranks``; each trainer adds its own checks and entries.
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specfamily.io.files import write_atomically
from specfamily.io.identity import target_identity


def read_state(path: Path) -> dict:
    """A saved training state, tensors and plain containers only: anything else in the file is refused unrun."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"refusing to resume from {str(path)!r}: it holds objects other than tensors and plain "
                         f"containers, which loading would have to run as code ({err}); delete it or use another "
                         "--ckpt") from None


def restore(run: Any, saved: dict, state_type: type) -> None:
    """Put a checked saved state back into ``run``: weights, optimizer, generator, scaler, counters, best."""
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    run.generator.set_state(saved["generator"])
    if saved.get("scaler"):
        run.scaler.load_state_dict(saved["scaler"])
    run.state = state_type(**saved["state"])
    run.best = saved["best"]
    if run.ranks.is_main:
        tqdm.write(f"resumed from {run.cfg.ckpt_path} at step {run.state.step}")


def save(run: Any, **extra: Any) -> None:
    """Write the resumable training state to ``run.cfg.ckpt_path`` (temporary file, then rename)."""
    path = run.cfg.ckpt_path
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": asdict(run.cfg), "state": asdict(run.state), "target": target_identity(run.target.model),
        "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
        "generator": run.generator.get_state(), "best": run.best, "scaler": run.scaler.state_dict(), **extra,
    }
    write_atomically(path, lambda tmp: torch.save(payload, tmp))


def check_common(cfg: Any) -> None:
    """The feature-drafter trainers' shared option checks: device, dtype, exactly one data source, draft_vocab."""
    from specfamily.train.precision import check_device, check_dtype

    check_device(cfg.device)
    check_dtype(cfg.dtype)
    if sum(map(bool, (cfg.tokens, cfg.dataset, cfg.distilled))) != 1:
        raise ValueError("give exactly one data source: --tokens FILE.npy, --dataset NAME or --distilled DIR")
    if cfg.draft_vocab < 0:
        raise ValueError(f"draft_vocab must be >= 0 (0 = the full vocabulary), got {cfg.draft_vocab}")


def parse_config(config: type, prog: str, description: str | None, argv: list[str] | None,
                 checked: dict[str, Callable[[str], Any]]) -> Any:
    """``config`` from command-line flags named after its fields (``--seq-len 256``): a field without a default is
    required, a bool field is a switch (default off), ``checked`` gives a field its own parser."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(config):
        flag = "--" + f.name.replace("_", "-")
        if f.default is dataclasses.MISSING:
            parser.add_argument(flag, dest=f.name, required=True)
        elif isinstance(f.default, bool):
            parser.add_argument(flag, dest=f.name, action="store_true", help="default: off")
        else:
            parser.add_argument(flag, dest=f.name, type=checked.get(f.name, type(f.default)), default=f.default,
                                help=f"default: {f.default!r}")
    return config(**vars(parser.parse_args(argv)))
