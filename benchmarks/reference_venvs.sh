#!/usr/bin/env bash
# Rebuilds the side venvs the reference comparisons run in (never the project's own venv):
#   lade       lade==0.0.2 (hao-ai-lab/LookaheadDecoding) with transformers 4.34.1, the version its patched Llama
#              forward and greedy search are written for (`padding_mask` in the decoder layer, `_expand_mask`,
#              `GreedySearchOutput`); torch pinned to the CPU build (an unpinned torch pulls the CUDA wheels).
#   rest       draftretriever==0.1.1 from the registry: ADED's tri-gram retriever (liuxukun2000/ADED), not REST's.
#   rest-orig  REST's own DraftRetriever 0.1.0 (a suffix array), the cp39 wheel in FasterDecoding/REST's repo
#              (DraftRetriever/wheels/draftretriever-0.1.0-cp39-cp39-manylinux_2_34_x86_64.whl): needs a Python 3.9
#              (PYTHON39) and the wheel's path (REST_WHEEL); skipped when either is missing. Building it from its
#              Rust source instead needs crates.io.
#   bash benchmarks/reference_venvs.sh [ROOT]      # ROOT: /work/sidevenv by default
set -euo pipefail
ROOT=${1:-/work/sidevenv}
TORCH=${TORCH:-torch==2.13.0}
PYTHON39=${PYTHON39:-/root/.pyenv/versions/3.9.18/bin/python}
REST_WHEEL=${REST_WHEEL:-/tmp/refpk/draftretriever-0.1.0-cp39-cp39-manylinux_2_34_x86_64.whl}
mkdir -p "$ROOT"
rm -rf "$ROOT/lade" "$ROOT/rest" "$ROOT/rest-orig"
python3 -m venv "$ROOT/lade"
"$ROOT/lade/bin/pip" install "$TORCH" 'transformers==4.34.1' 'numpy<2' lade==0.0.2
"$ROOT/lade/bin/python" -c "import lade, transformers; print('lade ok, transformers', transformers.__version__)"
python3 -m venv "$ROOT/rest"
"$ROOT/rest/bin/pip" install 'numpy<2' draftretriever==0.1.1
"$ROOT/rest/bin/python" -c "import draftretriever; print('draftretriever 0.1.1 ok')"
if [ -x "$PYTHON39" ] && [ -f "$REST_WHEEL" ]; then
    "$PYTHON39" -m venv "$ROOT/rest-orig"
    "$ROOT/rest-orig/bin/pip" install 'numpy<2' "$REST_WHEEL"
    "$ROOT/rest-orig/bin/python" -c "import draftretriever; print('draftretriever 0.1.0 (REST) ok')"
else
    echo "rest-orig skipped: need PYTHON39=$PYTHON39 and REST_WHEEL=$REST_WHEEL" >&2
fi
