#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh needs on a GPU machine with no package registry and an older transformers (the
# lent H200 image had transformers 5.17 and no hydra): the project's transformers and what it imports beyond that
# image, for CPython 3.12 on x86-64, downloaded here into .whl/ (git-ignored through .git/info/exclude). Then name
# .whl in the device tool's carry; gpu_check.sh installs them into /tmp/site.
#
#   bash benchmarks/gpu_wheels.sh      # from the repository root, where pip reaches the registry
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY=${PYTHON:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 regex==2026.1.15 httpx2==2.16.2 httpcore2==2.16.2 \
    truststore==0.10.5 idna==3.20 click==8.5.1 anyio==4.16.0 h11==0.16.0 tomlkit==0.15.3 hydra-core==1.3.8 \
    omegaconf==2.3.1
# antlr4-python3-runtime 4.9.3 (hydra's pin) is published as a source archive only: build its pure-Python wheel here
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
du -sh .whl
