#!/usr/bin/env bash
# The GPU checks, as one prepared script for a lent GPU machine (about 5 minutes on an H200; each step has a
# time limit, and all of them GPU_CHECK_BUDGET seconds, 540 by default, under the device tool's 600 s a command: a
# step the budget no longer covers is stopped at once and reported as failed or WARN):
#   1. the CUDA test subset (pytest -m "cuda and not slow" tests/gpu): greedy identity (fp32) and near-ties only
#      (bf16) of plain decoding and every drafter against transformers' generate, the verifier and whole
#      generations of every registered drafter (chain and tree modes, each sampling setting in rotation) against
#      the exact law (chi-square), the device walk (tests/gpu/test_cuda_verify.py: the CPU result for the same
#      uniforms, one host synchronisation a pass, the textbook law), a tree commit on a cache split over CPU and
#      GPU, a training step of each trainer in fp32 and bf16. The whole CUDA matrix (every drafter x mode x sampling setting): pytest -m cuda tests/gpu.
#  1c. host synchronisations per verification pass (benchmarks/gpu_syncs.py): each one named by its aten op and
#      file:line under torch.cuda's sync debug mode, beside the CPU stand-in count (specfamily.testing.syncs); the
#      debug mode's one-time notice shows on the first pass, not counted (session 15's tests counted it: their "2 a
#      pass", docs/gpu-h200.md); the counter itself is checked against the debug mode op by op in
#      tests/gpu/test_cuda_syncs.py (step 1);
#   2. the verifier's time per pass on CUDA tensors (informational): the device walk (one host sync a pass)
#      against the host walk (p and q copied to the host once), and verify_draft (warp + walk), V 4096 / 49152;
#   3. one benchmark: benchmarks/peer.py on zoo:code-target (shipped in the repository) on the GPU in float32;
#   4. real target shapes with random weights (benchmarks/gpu_shapes.py): SmolLM2-135M's architecture in float32 and
#      bfloat16 and an 8B Llama-3-shaped target in bfloat16, built on the GPU: the pass-cost curve t(1 + g) / t(1) for
#      g up to 64 over a 512-token cache, and plain decoding against transformers' generate() (tokens/s, identity).
#   5. batched decoding, random SmolLM2 weights (benchmarks/gpu_batch.py): t(B, 5) / t(B, 1) for B = 1..64 (issue
#      33's picture: verifying 5 tokens for B requests against writing 1), plain batched decoding against
#      transformers' padded batch at B = 1 / 8 / 32 (tokens/s, identity) and prompt lookup beside it (informational);
#      the batched greedy identity of every drafter is in step 1 (test_cuda_greedy.py, max_batch 4).
# Then a summary, also as one JSON ($LOGS/gpu_check.json); the exit status is non-zero when a check failed.
#
#   bash benchmarks/gpu_check.sh        # from the repository root
#
# Nothing is downloaded: the project runs from this tree (PYTHONPATH) with the machine's own torch, offline. Where
# the machine's transformers is older than the project's floor (5.23), carry the wheels benchmarks/gpu_wheels.sh
# downloads into .whl/ (name .whl in the device tool's carry): this script installs them into /tmp/site first.
# Logs go to $GPU_CHECK_LOGS, else $OUT (the device tool's folder), else a temp dir.
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${GPU_CHECK_LOGS:-${OUT:-$(mktemp -d)}}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)  # absolute: step 5 runs from benchmarks/
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" > /dev/null && ! "$PY" -c "import sys, transformers, hydra
sys.exit(tuple(int(x) for x in transformers.__version__.split('.')[:2]) < (5, 23))" 2> /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "could not install the carried wheels in .whl/"; exit 1; }
    export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
STARTED=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-540}  # seconds for the whole script: the device tool stops a command at 600

limit() {  # limit SECONDS: a step's own time limit, cut to what the budget leaves (15 s kept for the summary)
    local left=$((BUDGET - (SECONDS - STARTED) - 15))
    if [ "$left" -lt 1 ]; then left=1; fi
    echo $(($1 < left ? $1 : left))
}
SUMMARY=()
rm -f "$LOGS/summary.tsv"
FAILED=0

record() {  # record NAME STATUS SECONDS NOTE
    SUMMARY+=("$(printf '%-28s %-5s %5ss  %s' "$1" "$2" "$3" "$4")")
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >> "$LOGS/summary.tsv"
    if [ "$2" = FAIL ]; then FAILED=1; fi
}

summary() {
    echo
    echo "== gpu_check summary ($((SECONDS - STARTED)) s; logs in $LOGS)"
    printf '%s\n' "${SUMMARY[@]}"
    if [ "$FAILED" = 0 ]; then echo "ALL CHECKS PASSED"; else echo "SOME CHECKS FAILED"; fi
    "$PY" - "$LOGS" <<'EOF' || true  # one JSON: every check's verdict, the shapes' and the peer's measurements
import json
import pathlib
import sys

logs = pathlib.Path(sys.argv[1])
checks = [dict(zip(("check", "status", "seconds", "note"), line.split("\t"), strict=True))
          for line in (logs / "summary.tsv").read_text().splitlines()]
out = {"checks": checks}
for name in ("shapes", "peer", "batch"):
    if (logs / f"{name}.json").is_file():
        out[name] = json.loads((logs / f"{name}.json").read_text())
(logs / "gpu_check.json").write_text(json.dumps(out, indent=1))
print(f"wrote {logs / 'gpu_check.json'}")
EOF
}

echo "== environment"
if ! "$PY" - <<'EOF' 2>&1 | tee "$LOGS/environment.log"; then
import sys

import torch
import transformers

print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
if not torch.cuda.is_available():
    sys.exit("CUDA is not available: nothing to check here")
print(f"GPU: {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)")
if tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 23):  # the floor pyproject.toml pins
    print(f"WARNING: transformers {transformers.__version__} is below the project's floor 5.23 (the tests may fail "
          "on its API): run benchmarks/gpu_wheels.sh where pip works and name .whl in the device tool's carry")
import specfamily  # noqa: F401,E402  (from this tree)
EOF
    record environment FAIL $((SECONDS - STARTED)) "no CUDA or the project does not import"
    summary
    exit 1
fi
record environment PASS $((SECONDS - STARTED)) "$(tail -n 1 "$LOGS/environment.log")"

echo "== 1. CUDA test subset"
t0=$SECONDS
timeout "$(limit "${CUDA_TESTS_LIMIT:-300}")" "$PY" -m pytest -m "cuda and not slow" tests/gpu -q -rfEs -p no:cacheprovider \
    --junitxml="$LOGS/cuda-tests.xml" 2>&1 | tee "$LOGS/cuda-tests.log"
rc=$?
line=$(grep -E '^[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$LOGS/cuda-tests.log" | tail -n 1)
if [ "$rc" = 0 ] && ! grep -qE '[0-9]+ skipped' <<<"$line"; then
    record "CUDA tests" PASS $((SECONDS - t0)) "$line"
else
    record "CUDA tests" FAIL $((SECONDS - t0)) "rc $rc: ${line:-no result (timed out?)}"
fi

first=$(grep -m1 -oE '^FAILED [^ ]+' "$LOGS/cuda-tests.log" | cut -d' ' -f2)
if [ -n "$first" ]; then  # CUDA reports a kernel's fault at a later call: rerun the first failure synchronously
    echo "== 1b. $first again with CUDA_LAUNCH_BLOCKING=1 (the faulting call in the traceback)"
    CUDA_LAUNCH_BLOCKING=1 timeout "$(limit 120)" "$PY" -m pytest "$first" -n 0 -x -q -p no:cacheprovider 2>&1 \
        | tee "$LOGS/first-failure.log" | grep -E '^(E |specfamily/|tests/|[a-z_/]+\.py:[0-9]+)' | head -40
fi

echo "== 1c. host synchronisations per verification pass, by aten op (CUDA) and on CPU stand-ins"
t0=$SECONDS
timeout "$(limit 120)" "$PY" benchmarks/gpu_syncs.py 2>&1 | tee "$LOGS/syncs.log"
rc=$?
record "syncs per pass" "$([ "$rc" = 0 ] && echo PASS || echo FAIL)" $((SECONDS - t0)) \
    "$(tail -n 1 "$LOGS/syncs.log"); every pass in syncs.log"

echo "== 2. verifier time per pass on CUDA (informational): device walk vs host walk"
t0=$SECONDS
timeout "$(limit 90)" "$PY" - <<'EOF' 2>&1 | tee "$LOGS/verify-timing.log"
import time

import torch

from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import verify_tree

TREE12 = [-1, -1, 0, 0, 1, 2, 2, 3, 5, 6, 7, 8]


def per_pass_ms(fn, passes=50):
    for _ in range(5):  # warm-up
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(passes):
        fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / passes


gen = torch.Generator().manual_seed(0)
cuda_gen = torch.Generator(device="cuda").manual_seed(0)
sampling = SamplingConfig(0.7, top_p=0.9)
for vocab in (4096, 49152):
    for shape, parents in (("plain", []), ("chain 4", [-1, 0, 1, 2]), ("tree 4", [-1, -1, 0, 1]),
                           ("chain 12", list(range(-1, 11))), ("tree 12", TREE12)):
        n, parents = len(parents), torch.tensor(parents, dtype=torch.long)
        logits = (3 * torch.randn(n + 1, vocab, generator=gen)).cuda()
        p = warp(logits, sampling)
        q = warp(logits[parents + 1] + torch.randn(n, vocab, generator=gen).cuda(), sampling) if n else None
        tokens = torch.multinomial(q, 1, generator=cuda_gen).view(-1) if n else torch.zeros(0, dtype=torch.long).cuda()
        for sampled in (True, False):
            q_used = q if sampled else None
            device = per_pass_ms(lambda: verify_tree(tokens, parents, q_used, p, cuda_gen))
            hosted = per_pass_ms(lambda: verify_tree(tokens, parents, q_used, p, cuda_gen, device_walk=False))
            draft = Draft(tokens=tokens, parents=parents, q=q_used)
            whole = per_pass_ms(lambda: verify_draft(draft, logits, sampling, cuda_gen))
            kind = "sampled" if sampled else "deterministic"
            print(f"V={vocab:6d} {shape:8s} {kind:13s}: device walk {device:7.3f} ms/pass, host walk {hosted:7.3f} "
                  f"ms/pass; verify_draft (warp + device walk) {whole:7.3f} ms/pass")
            if not n:
                break
EOF
rc=$?
record "verify timing" "$([ "$rc" = 0 ] && echo INFO || echo WARN)" $((SECONDS - t0)) "see verify-timing.log"

echo "== 3. benchmark: peer.py on zoo:code-target, cuda, float32"
t0=$SECONDS
rm -f "$LOGS/peer.json"
timeout "$(limit 180)" "$PY" benchmarks/peer.py --target zoo:code-target --device cuda --dtype float32 --threads 4 --count 4 \
    --tokens 64 --repeats 2 ${PEER_ROWS:+--only $PEER_ROWS} --out "$LOGS/peer.json" --markdown "$LOGS/peer.md" 2>&1 | tee "$LOGS/peer.log"
rc=$?
if [ "$rc" = 0 ]; then
    record "benchmark peer.py" PASS $((SECONDS - t0)) "all rows identical to transformers; table in peer.md"
elif [ -f "$LOGS/peer.json" ]; then  # it ran to the end: some row's text differs from transformers' greedy text
    record "benchmark peer.py" FAIL $((SECONDS - t0)) "outputs differ from transformers (see peer.md)"
else
    record "benchmark peer.py" FAIL $((SECONDS - t0)) "rc $rc: did not finish (see peer.log)"
fi

echo "== 4. real target shapes, random weights: pass-cost curve and plain decoding vs transformers"
t0=$SECONDS
timeout "$(limit "${SHAPES_LIMIT:-150}")" "$PY" benchmarks/gpu_shapes.py --out "$LOGS/shapes.json" 2>&1 | tee "$LOGS/shapes.log"
rc=$?
record "shapes (informational)" "$([ "$rc" = 0 ] && echo INFO || echo WARN)" $((SECONDS - t0)) "see shapes.json"

echo "== 5. batched decoding, random SmolLM2 weights: t(B, 5) / t(B, 1) and plain batched decoding vs transformers"
t0=$SECONDS
rm -f "$LOGS/batch.json"
(cd benchmarks && timeout "$(limit "${BATCH_LIMIT:-120}")" "$PY" gpu_batch.py --out "$LOGS/batch.json") 2>&1 \
    | tee "$LOGS/batch.log"
rc=$?
record "batched (informational)" "$([ "$rc" = 0 ] && echo INFO || echo WARN)" $((SECONDS - t0)) "see batch.json"

summary
exit "$FAILED"
