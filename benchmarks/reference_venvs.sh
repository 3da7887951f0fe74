#!/usr/bin/env bash
# Rebuilds the side venvs the reference comparisons run in (never the project's own venv): lade needs the
# transformers its patched Llama forward and greedy search were written for (4.34: `padding_mask` in the decoder
# layer, `_expand_mask`, `GreedySearchOutput`); draftretriever is a Rust wheel (cp311, manylinux). torch is pinned
# to the CPU build (an unpinned torch pulls the CUDA wheels).
#   bash benchmarks/reference_venvs.sh [ROOT]      # ROOT: /work/sidevenv by default
# then: python benchmarks/reference_lookahead.py --venv ROOT/lade; python benchmarks/reference_rest.py --venv ROOT/rest
set -euo pipefail
ROOT=${1:-/work/sidevenv}
TORCH=${TORCH:-torch==2.13.0}
mkdir -p "$ROOT"
rm -rf "$ROOT/lade" "$ROOT/rest"
python3 -m venv "$ROOT/lade"
"$ROOT/lade/bin/pip" install "$TORCH" 'transformers==4.34.1' 'numpy<2' lade==0.0.2
python3 -m venv "$ROOT/rest"
"$ROOT/rest/bin/pip" install "$TORCH" 'numpy<2' draftretriever==0.1.1
"$ROOT/lade/bin/python" -c "import lade, transformers; print('lade ok, transformers', transformers.__version__)"
"$ROOT/rest/bin/python" -c "import draftretriever; print('draftretriever ok')"
