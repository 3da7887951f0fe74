"""What a run ran on, for ``run.json``: package versions, plugins, git commit, hardware, weights, prompts. Cheap on any
model size: the weights hash reads a fixed number of entries per parameter, the prompts' fingerprint the token ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("specfamily", "torch", "transformers", "hydra-core", "omegaconf", "datasets", "accelerate", "numpy",
            "scipy")
PLUGIN_GROUP = "specfamily"  # the entry-point group third-party drafters register under
SAMPLE_PER_TENSOR = 1024  # entries of each parameter the weights hash reads, evenly strided
WEIGHTS_METHOD = f"sha256 over every parameter's name, shape, dtype and {SAMPLE_PER_TENSOR} evenly strided entries"


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(folder: Path | None = None) -> dict[str, Any] | None:
    """The specfamily checkout's commit and whether it has local changes; None outside a git checkout."""
    folder = folder or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def plugin_distributions(group: str = PLUGIN_GROUP) -> list[dict[str, str | None]]:
    """Every entry point of ``group``: its name, object reference, distribution and version (sorted by name)."""
    found = []
    for entry in metadata.entry_points(group=group):
        dist = entry.dist
        found.append({"name": entry.name, "value": entry.value, "distribution": dist.name if dist else None,
                      "version": dist.version if dist else None})
    return sorted(found, key=lambda e: (e["name"], e["value"]))


def weights_hash(model: torch.nn.Module) -> dict[str, Any] | None:
    """A hash of ``model``'s weights from a strided sample of every parameter (see :data:`WEIGHTS_METHOD`).

    Changes with any fine-tune, another checkpoint or another dtype; reads ``SAMPLE_PER_TENSOR``
    entries per parameter, so it costs the same for a 70B model on GPUs as for a tiny one.
    None when parameters are not materialised (offloaded to the meta device).
    """
    digest, count = hashlib.sha256(), 0
    for name, param in sorted(model.named_parameters()):
        if param.device.type == "meta":
            return None
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // SAMPLE_PER_TENSOR)].contiguous().cpu()
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}\n".encode())
        digest.update(sample.view(torch.uint8).numpy().tobytes())
        count += param.numel()
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    return {"sha256": digest.hexdigest(), "method": WEIGHTS_METHOD, "parameters": count, "dtype": ",".join(dtypes)}


def prompts_fingerprint(prompts: Sequence[Any]) -> str:
    """sha256 of the selected prompts: each one's id, turn-1 token ids, user turns and category, in order."""
    rows = [[p.id, list(p.ids), list(p.turns), p.category] for p in prompts]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def hardware(device: torch.device) -> dict[str, Any]:
    """The machine a run ran on: CPU and GPU models, CUDA version, cores, torch threads, load average."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(), "machine": platform.machine(), "cpus": os.cpu_count(), "usable_cpus": usable,
        "torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
        "device": str(device), "gpu": gpu, "cuda": torch.version.cuda, "load_average_1m": load,
    }
