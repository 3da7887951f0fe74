"""The sampled verification of one pass, before against now, at SmolLM2's vocabulary (V = 49152).

before: ``verify_draft`` as it was before the kept head was written into a zero row: the same lazy rows and walk,
but top-p builds a vocabulary-wide bool mask from the head and multiplies the row by it (the same tensor, bit for
bit), and the walk's residuals are not updated in place.
now: ``verify_draft`` as the loop calls it: the rows the walk reads warped lazily (top-p over a bounded ``torch.topk``
head, its kept values scattered into a zero row), q's quick check, the final token by inversion of one uniform.
device walk (CPU): every row warped at once, then the device walk (``verify_tree(device_walk=True)``: trees in one
branch-free sweep, chains in one vectorised block, one host synchronisation) on CPU tensors: what an accelerator
runs, timed here on the CPU to show whether it would pay there.
old: the warp before the bounded head (a full descending sort of every row) on all n + 1 rows, then the walk with
multinomial: the first baseline. Each pass has its own generator (seeded by its index): old, before and now must take
the same paths (their tries read the same uniforms), and before and now the same next tokens: both are checked.
Times are CPU seconds of this process (``time.process_time``; one thread), the median of ``--repeats`` interleaved
repeats. Also the warp alone (before and now checked equal, bit for bit).

Logits are random (``--scale`` times a standard normal) or, with ``--model zoo:smollm2``, the target's own rows
over its sampled answers to Spec-Bench questions (n + 1 consecutive rows a pass); the kept nucleus sizes are
printed. Drafts are chains and trees of n = 0, 4, 12 nodes whose tokens are drawn from q = warp(logits + ``--tilt``
noise), or from q = p (``--tilt 0``: every node accepted, the walk reads every row: the worst case for warping
lazily).

    python benchmarks/warp.py --threads 1
    python benchmarks/warp.py --threads 1 --model zoo:smollm2
    python benchmarks/warp.py --threads 1 --model zoo:smollm2 --decode 4 --repeats 2   # and plain decoding's ms/token
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from specfamily.core import host
from specfamily.core import verify as verify_module
from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import TOP_P_START, top_k_filter, top_p_keep, warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import _children, _walk, check_q, verify_tree, verify_tree_rows

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


class MultinomialDraws(host.HostDraws):
    """The host walk's draws as they were: the final token by torch.multinomial over the whole row."""

    def sample(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator).item())


def old_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """verify_draft and verify_tree as they were first (CPU tensors): every row warped with a full sort, p and q in
    float64 whole, the final token by multinomial."""
    p = old_warp(logits, sampling)
    q64 = None if draft.q is None else draft.q.double()
    if q64 is not None:
        check_q(q64, draft.q.dtype)
    draws = MultinomialDraws(generator)
    return _walk(_children(draft.parents.tolist()), draft.tokens.tolist(), q64, p.double(), draws)


def mask_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The warp before the kept head was scattered into a zero row: a vocabulary-wide mask, then a product."""
    scaled = logits.float() / sampling.temperature
    probs = torch.softmax(top_k_filter(scaled, sampling.top_k), dim=-1)
    if sampling.top_p >= 1.0:
        return probs
    start = sampling.top_k + 1 if sampling.top_k > 0 else TOP_P_START
    kept = probs * top_p_keep(probs.reshape(-1, probs.shape[-1]), sampling.top_p, start).view(probs.shape)
    return kept / kept.sum(dim=-1, keepdim=True)


def _walk_out_of_place(residual: torch.Tensor, token: int, q_row, draws, node: int = 0):
    """``verify._try_child`` before the in-place residual."""
    if q_row is None:
        return verify_module._try_child(residual, token, q_row, draws, node)
    q_x = q_row[token].item()
    if q_x <= 0:
        raise verify_module._zero_q_error(token, node)
    if draws.uniform() < min(1.0, residual[token].item() / q_x):
        return True, residual
    return False, torch.clamp(residual - q_row, min=0.0)


def before_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """verify_draft before this work: the same lazy rows, warped with the mask and product, out-of-place residuals."""
    def p_row(i: int) -> torch.Tensor:
        return mask_warp(logits[i : i + 1], sampling)[0]

    try_child, normalise = verify_module._try_child, verify_module._normalise
    verify_module._try_child = _walk_out_of_place
    verify_module._normalise = _normalise_out_of_place
    try:
        return verify_tree_rows(draft.tokens, draft.parents, draft.q, p_row, tuple(logits.shape), generator)
    finally:
        verify_module._try_child, verify_module._normalise = try_child, normalise


def _normalise_out_of_place(rejected: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    total = rejected.sum()
    return verify_module._all_zero_fallback(current) if total <= 0 else rejected / total


def device_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """Every row warped at once, then the device walk on the CPU tensors."""
    return verify_tree(draft.tokens, draft.parents, draft.q, warp(logits, sampling), generator, device_walk=True)


def model_rows(name: str, path: str, count: int, tokens: int, sampling: SamplingConfig) -> torch.Tensor:
    """(R, V) the target's logits over its own sampled answers (plain decoding) to the first ``count`` questions."""
    import specfamily as sf

    target = sf.load_target(name)
    rows = []
    for seed, turn in enumerate(questions(path, count)):
        ids = prompt_ids(target, turn)
        answer = sf.generate(target, None, ids, max_new_tokens=tokens, sampling=sampling, seed=seed).tokens
        with torch.no_grad():
            logits = target.model(torch.tensor([ids + answer])).logits[0].float()
        rows.append(logits[len(ids) - 1 : len(ids) + len(answer) - 1])  # the rows that produced the answer
    return torch.cat(rows)


def questions(path: str, count: int) -> list[str]:
    with open(path) as lines:
        return [json.loads(line)["turns"][0] for line, _ in zip(lines, range(count), strict=False)]


def prompt_ids(target, turn: str) -> list[int]:
    ids = target.tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def decode_ms(name: str, path: str, count: int, tokens: int, sampling: SamplingConfig, repeats: int) -> None:
    """Plain decoding's CPU ms per new token: greedy, sampled with the mask-and-product warp (before), sampled now
    (the same texts); interleaved, ``repeats`` rounds over the first ``count`` questions, ``tokens`` new tokens each."""
    import specfamily as sf
    from specfamily.core import acceptance

    target = sf.load_target(name)
    prompts = [prompt_ids(target, turn) for turn in questions(path, count)]
    settings = {"greedy": (SamplingConfig(), warp), "sampled, before": (sampling, mask_warp),
                "sampled, now": (sampling, warp)}
    seconds, made = dict.fromkeys(settings, 0.0), dict.fromkeys(settings, 0)
    for _ in range(repeats):
        for label, (config, row_warp) in settings.items():
            acceptance.warp = row_warp
            try:
                for seed, ids in enumerate(prompts):
                    start = time.process_time()
                    out = sf.generate(target, None, ids, max_new_tokens=tokens, sampling=config, seed=seed)
                    seconds[label] += time.process_time() - start
                    made[label] += len(out.tokens)
            finally:
                acceptance.warp = warp
    greedy = seconds["greedy"] / made["greedy"]
    print(f"\n| plain decoding ({name}, {count} prompts x {tokens} tokens, {repeats} rounds) | ms / token | "
          "/ greedy |\n| --- | --- | --- |")
    for label in settings:
        per_token = seconds[label] / made[label]
        print(f"| {label} | {1e3 * per_token:.2f} | {per_token / greedy:.3f}x |")


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


def per_pass_ms(verifiers: dict[str, Callable], cases, sampling: SamplingConfig,
                repeats: int) -> tuple[dict[str, float], dict[str, list]]:
    """Per verifier: the median over ``repeats`` (the verifiers interleaved in each) of the mean CPU time per pass
    over ``cases`` (ms), and its outputs (each pass with its own generator, seeded by the pass's index)."""
    times: dict[str, list[float]] = {name: [] for name in verifiers}
    outputs: dict[str, list] = {}
    for _ in range(repeats):
        for name, verify in verifiers.items():
            gens = [torch.Generator().manual_seed(i) for i in range(len(cases))]
            start = time.process_time()
            outputs[name] = [verify(draft, logits, sampling, gen) for (draft, logits), gen in zip(cases, gens,
                                                                                                  strict=True)]
            times[name].append((time.process_time() - start) / len(cases))
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}, outputs


def warp_ms(fn: Callable, logits: torch.Tensor, sampling: SamplingConfig, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn(logits, sampling)
        times.append(time.process_time() - start)
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
    parser.add_argument("--decode", type=int, default=0, help="with --model: also time plain decoding, greedy and "
                        "sampled, over this many questions (48 new tokens each, --repeats rounds)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sampling = SamplingConfig(args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.model is not None and args.decode:
        decode_ms(args.model, args.questions, args.decode, 48, sampling, args.repeats)

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
    print("\n| warp alone | rows | old ms | before ms | now ms | before / now |\n| --- | --- | --- | --- | --- | --- |")
    for rows in (1, 13):
        times = {name: [] for name in ("old", "before", "now")}
        for _ in range(args.repeats):  # interleaved
            for name, fn in (("old", old_warp), ("before", mask_warp), ("now", warp)):
                times[name].append(warp_ms(fn, logits[:rows], sampling, 10))
        old, before, new = (statistics.median(times[name]) for name in ("old", "before", "now"))
        if not torch.equal(mask_warp(logits[:rows], sampling), warp(logits[:rows], sampling)):
            raise SystemExit("the warp changed its values")
        print(f"| per call | {rows} | {old:.3f} | {before:.3f} | {new:.3f} | {before / new:.2f}x |")

    verifiers = {"old": old_verify, "before": before_verify, "now": verify_draft, "device": device_verify}
    print("\n| pass | n | accepted (mean) | old ms | before ms | now ms | device walk (CPU) ms | before / now |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, shape in ((0, "chain"), (4, "chain"), (4, "tree"), (12, "chain"), (12, "tree")):
        cases = make_drafts(n, shape, args.passes, pool, args.vocab, args.scale, args.tilt, sampling)
        ms, out = per_pass_ms(verifiers, cases, sampling, args.repeats)
        paths = {name: [path for path, _ in outputs] for name, outputs in out.items()}
        if not paths["old"] == paths["before"] == paths["now"] or out["before"] != out["now"]:
            raise SystemExit(f"paths differ at n = {n} ({shape})")
        accepted = statistics.mean(len(path) for path in paths["now"])
        print(f"| {shape} | {n} | {accepted:.2f} | {ms['old']:.2f} | {ms['before']:.2f} | {ms['now']:.2f} | "
              f"{ms['device']:.2f} | {ms['before'] / ms['now']:.2f}x |")


if __name__ == "__main__":
    main()
