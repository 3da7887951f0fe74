"""Every trainer under torchrun: 2 CPU ranks (gloo, DistributedDataParallel) at ``--batch B`` end with the weights of
one process at ``--batch 2B`` after the same steps; one process at ``--batch B`` does not (the check can fail).
eagle3's runs in the default suite; the other trainers' (18-46 s each) with ``pytest -m slow``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specfamily.testing import tiny_model

STEPS = ["--steps", "4", "--threads", "1", "--lr", "3e-3", "--warmup", "1", "--save-dtype", "float32"]
TOLERANCE = 1e-5


def run(module: str, args: list[str], ranks: int = 1) -> None:
    """``python -m module args``, or the same under torchrun with ``ranks`` CPU processes."""
    launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, *launcher, "-m", module, *args], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def weights(path: Path, key: str) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)[key]


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def check(trained, tmp_path: Path) -> None:
    """``trained(name, batch, ranks)`` -> the weights; 2 ranks x 2 rows equal 1 x 4, and 1 x 2 differs."""
    doubled, split, single = trained("one", 4, 1), trained("two", 2, 2), trained("half", 2, 1)
    assert largest_difference(doubled, split) < TOLERANCE
    assert largest_difference(doubled, single) > 100 * TOLERANCE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny llama target folder and a token file (with zoo-style train/held-out arrays beside it)."""
    folder = tmp_path_factory.mktemp("ddp")
    tiny_model("llama", vocab_size=32, dtype=torch.float32, layers=4, spread=2.0).save_pretrained(folder / "target")
    tokens = np.random.default_rng(0).integers(0, 32, 6000).astype(np.int32)
    np.save(folder / "tokens.npy", tokens)
    np.save(folder / "train.npy", tokens[:5000])
    np.save(folder / "heldout.npy", tokens[5000:])
    return folder / "target", folder


def test_eagle3(tiny, tmp_path):
    target, data = tiny
    common = ["--target", str(target), "--tokens", str(data / "tokens.npy"), "--seq-len", "16", "--ttt-length", "3",
              "--eval-every", "0", "--ckpt-every", "0", "--minutes", "0", "--eval-windows", "4", *STEPS]

    def trained(name, batch, ranks):
        run("specfamily.drafters.eagle.train",
            ["--variant", "eagle3", *common, "--out", str(tmp_path / name), "--batch", str(batch)], ranks)
        return weights(tmp_path / f"{name}.train.pt", "model")

    check(trained, tmp_path)


@pytest.mark.slow  # 18-46 s each; eagle3's DDP test stays in the default suite
def test_eagle_with_feature_noise(tiny, tmp_path):
    """Each rank uses its own rows of the global batch's input noise (the default width 0.2)."""
    target, data = tiny
    common = ["--target", str(target), "--tokens", str(data / "tokens.npy"), "--seq-len", "16", "--eval-every", "0",
              "--ckpt-every", "0", "--minutes", "0", "--eval-windows", "4", "--tau-prompts", "0", *STEPS]

    def trained(name, batch, ranks):
        run("specfamily.drafters.eagle.train", [*common, "--out", str(tmp_path / name), "--batch", str(batch)], ranks)
        return weights(tmp_path / f"{name}.train.pt", "model")

    check(trained, tmp_path)


@pytest.mark.slow  # 18-46 s each; eagle3's DDP test stays in the default suite
def test_medusa(tiny, tmp_path):
    target, data = tiny
    common = ["--target", str(target), "--zoo-dir", str(data), "--seq-len", "16", "--eval-every", "0",
              "--max-minutes", "0", "--eval-windows", "4", "--eval-prompts", "1", "--prompt-len", "8",
              "--eval-tokens", "4", "--max-nodes", "4", "--ranks", "3", "--num-heads", "2", *STEPS]

    def trained(name, batch, ranks):
        run("specfamily.drafters.medusa.train", [*common, "--out", str(tmp_path / name), "--batch", str(batch)],
            ranks)
        return weights(tmp_path / name / "state.pt", "heads")

    check(trained, tmp_path)


@pytest.mark.slow  # 18-46 s each; eagle3's DDP test stays in the default suite
def test_draft_model(prepared, tmp_path):
    """The zoo trainer (``specfamily-zoo train``), half of each batch from greedy windows as in the zoo run."""
    greedy = np.load(prepared / "train.npy")[: 8 * 24].reshape(8, 24).astype(np.int32)
    np.save(tmp_path / "greedy.npy", greedy)
    common = ["train", "--kind", "tiny", "--workdir", str(prepared), "--seq-len", "32", "--eval-windows", "2",
              "--eval-every", "100", "--ckpt-every", "100", "--greedy-data", str(tmp_path / "greedy.npy"),
              "--steps", "4", "--lr", "3e-3", "--warmup", "1"]

    def trained(name, batch, ranks):
        out = tmp_path / f"ddp-{tmp_path.name}-{name}"  # the checkpoint goes to the shared work folder, by this name
        run("specfamily.recipes", [*common, "--out", str(out), "--batch", str(batch)], ranks)
        return weights(prepared / f"ckpt-{out.name}.pt", "model")

    check(trained, tmp_path)
