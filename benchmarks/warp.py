"""The sampled verification of one pass, old against new, at SmolLM2's vocabulary (V = 49152).

old: the warp as it was (temperature, top-k, softmax, top-p by a full descending sort of every row) on all n + 1
fed rows, then the walk over p and q converted to float64 whole (verify_tree's body before this change).
new: ``verify_draft`` as the loop calls it: top-p over a bounded ``torch.topk`` head, and on the CPU only the rows
the walk reads warped (the root's, then each accepted node's). new-batched: the new warp on all rows at once, then
the walk: the alternative to warping lazily. Outputs (path and token, generator state) are checked equal on every
pass. Also the warp alone per row (one row, and 13 rows at once), old and new.

Logits are random (``--scale`` times a standard normal) or, with ``--model zoo:smollm2``, the target's own rows
over its sampled answers to Spec-Bench questions (n + 1 consecutive rows a pass); the kept nucleus sizes are
printed. Drafts are chains and trees of n = 0, 4, 12 nodes whose tokens are drawn from q = warp(logits + ``--tilt``
noise), or from q = p (``--tilt 0``: every node accepted, the walk reads every row: the worst case for warping
lazily).

    python benchmarks/warp.py --threads 1
    python benchmarks/warp.py --threads 1 --model zoo:smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from specfamily.core import host
from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import top_k_filter, warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import _children, _walk, check_q, verify_tree

TREES = {  # n -> parents: root with two branches, and for 12 a wider, deeper tree
    4: [-1, -1, 0, 1],
    12: [-1, -1, 0, 0, 1, 2, 2, 3, 5, 6, 7, 8],
}


def old_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The warp before the bounded head: top-p sorts every row over the whole vocabulary."""
    scaled = logits.float() / sampling.temperature
    probs = torch.softmax(top_k_filter(scaled, sampling.top_k), dim=-1)
    if sampling.top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) < sampling.top_p
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def old_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """verify_draft and verify_tree as they were (CPU tensors): every row warped, p and q in float64 whole."""
    p = old_warp(logits, sampling)
    q64 = None if draft.q is None else draft.q.double()
    if q64 is not None:
        check_q(q64, draft.q.dtype)
    draws = host.HostDraws(generator)
    return _walk(_children(draft.parents.tolist()), draft.tokens.tolist(), q64, p.double(), draws)


def batched_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """The new warp on all rows at once, then the walk."""
    return verify_tree(draft.tokens, draft.parents, draft.q, warp(logits, sampling), generator)


def model_rows(name: str, questions: str, count: int, tokens: int, sampling: SamplingConfig) -> torch.Tensor:
    """(R, V) the target's logits over its own sampled answers (plain decoding) to the first ``count`` questions."""
    import specfamily as sf

    target = sf.load_target(name)
    rows = []
    with open(questions) as lines:
        turns = [json.loads(line)["turns"][0] for line, _ in zip(lines, range(count), strict=False)]
    for seed, turn in enumerate(turns):
        ids = target.tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        answer = sf.generate(target, None, ids, max_new_tokens=tokens, sampling=sampling, seed=seed).tokens
        with torch.no_grad():
            logits = target.model(torch.tensor([ids + answer])).logits[0].float()
        rows.append(logits[len(ids) - 1 : len(ids) + len(answer) - 1])  # the rows that produced the answer
    return torch.cat(rows)


def make_drafts(n: int, shape: str, count: int, pool: torch.Tensor | None, vocab: int, scale: float, tilt: float,
                sampling: SamplingConfig) -> list[tuple[Draft, torch.Tensor]]:
    """``count`` (draft, logits (n + 1, V)) pairs; tokens drawn from their q rows; logits n + 1 consecutive rows of
    ``pool`` (R, V), or random."""
    gen = torch.Generator().manual_seed(n * 100 + len(shape))
    parents = torch.tensor(list(range(-1, n - 1)) if shape == "chain" else TREES[n], dtype=torch.long)
    out = []
    for i in range(count):
        if pool is None:
            logits = scale * torch.randn(n + 1, vocab, generator=gen)
        else:
            at = (i * 7) % (pool.shape[0] - n)
            logits = pool[at : at + n + 1]
        if n == 0:
            out.append((Draft(tokens=torch.zeros(0, dtype=torch.long), parents=parents, q=None), logits))
            continue
        q = warp(logits[parents + 1] + tilt * torch.randn(n, vocab, generator=gen), sampling)  # (n, V)
        tokens = torch.multinomial(q, 1, generator=gen).view(-1)
        out.append((Draft(tokens=tokens, parents=parents, q=q), logits))
    return out


def per_pass_ms(verify: Callable, cases, sampling: SamplingConfig, repeats: int) -> tuple[float, list]:
    """Median over ``repeats`` of the mean time per pass over ``cases`` (ms), and the outputs of the last repeat."""
    times, outputs = [], []
    for _ in range(repeats):
        outputs = []
        gen = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for draft, logits in cases:
            outputs.append(verify(draft, logits, sampling, gen))
        times.append((time.perf_counter() - start) / len(cases))
    return 1e3 * statistics.median(times), outputs


def warp_ms(fn: Callable, logits: torch.Tensor, sampling: SamplingConfig, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(logits, sampling)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--scale", type=float, default=3.0, help="logits = scale * N(0, 1)")
    parser.add_argument("--tilt", type=float, default=1.0, help="q = warp(logits + tilt * N(0, 1)); 0: q = p")
    parser.add_argument("--model", default=None, help="take logits from this target (zoo:smollm2) instead")
    parser.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--answers", type=int, default=8, help="with --model: questions answered")
    parser.add_argument("--passes", type=int, default=20, help="drafts per (n, shape); each timed pass is one")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sampling = SamplingConfig(args.temperature, top_k=args.top_k, top_p=args.top_p)

    pool = None
    if args.model is not None:
        pool = model_rows(args.model, args.questions, args.answers, 48, sampling)
        args.vocab = pool.shape[1]
    logits = args.scale * torch.randn(13, args.vocab, generator=torch.Generator().manual_seed(1))
    logits = logits if pool is None else pool[:13]
    nucleus = sorted((warp(logits if pool is None else pool, sampling) > 0).sum(-1).tolist())
    source = f"logits = {args.scale} * N(0, 1)" if pool is None else f"{args.model}'s rows ({pool.shape[0]})"
    quartiles = [nucleus[int(f * (len(nucleus) - 1))] for f in (0, 0.25, 0.5, 0.75, 0.9, 1)]
    print(f"# {sampling}, V = {args.vocab}, {source}, tilt {args.tilt}, {args.threads} thread(s); kept tokens per "
          f"row (min, 25%, median, 75%, 90%, max): {quartiles}")
    print("\n| warp alone | rows | old ms | new ms | old / new |\n| --- | --- | --- | --- | --- |")
    for rows in (1, 13):
        old = warp_ms(old_warp, logits[:rows], sampling, 10 * args.repeats)
        new = warp_ms(warp, logits[:rows], sampling, 10 * args.repeats)
        print(f"| per call | {rows} | {old:.3f} | {new:.3f} | {old / new:.1f}x |")

    print("\n| pass | n | accepted (mean) | old ms | new ms (lazy) | new-batched ms | old / new |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, shape in ((0, "chain"), (4, "chain"), (4, "tree"), (12, "chain"), (12, "tree")):
        cases = make_drafts(n, shape, args.passes, pool, args.vocab, args.scale, args.tilt, sampling)
        old, old_out = per_pass_ms(old_verify, cases, sampling, args.repeats)
        new, new_out = per_pass_ms(verify_draft, cases, sampling, args.repeats)
        batched, batched_out = per_pass_ms(batched_verify, cases, sampling, args.repeats)
        if not old_out == new_out == batched_out:
            raise SystemExit(f"outputs differ at n = {n} ({shape})")
        accepted = statistics.mean(len(path) for path, _ in new_out)
        print(f"| {shape} | {n} | {accepted:.2f} | {old:.2f} | {new:.2f} | {batched:.2f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
