"""benchmarks/pass_overlap.cpp builds and every arm runs an emulated pass to the end (its spinning worker hands every
region back: no hang), not its numbers."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "benchmarks" / "pass_overlap.cpp"
ARMS = {0: "omp", 1: "pool", 2: "pool+prefetch", 3: "omp+tail"}


def _avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None or not _avx512():
        pytest.skip("needs g++ and an AVX-512F CPU")
    out = tmp_path_factory.mktemp("overlap") / "pass_overlap"
    subprocess.run(
        [compiler, "-O2", "-mavx512f", "-mfma", "-fopenmp", "-std=c++17", str(SOURCE), "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_every_arm_runs_an_emulated_pass(program, arm):
    done = subprocess.run(
        [str(program), "4096", "65536", "1", str(arm), "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"OMP_NUM_THREADS": "2"},
    )
    assert done.returncode == 0, done.stderr
    found = re.fullmatch(
        r"kv 4096 cap 65536 gaps x1\.0  (\d+) MB  (\S+)\s+min ([\d.]+)  median ([\d.]+) ms\n", done.stdout
    )
    assert found, done.stdout
    megabytes, name, best, median = found.groups()
    assert name == ARMS[arm] and int(megabytes) == 28  # two layers of q/k/v, o, gate+up and down
    assert 0 < float(best) <= float(median)
