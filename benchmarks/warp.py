"""The sampled verification of one pass, before against now, at SmolLM2's vocabulary (V = 49152).

before: ``verify_draft`` as session 19 left it (main at 62fccdb): the rows the walk reads warped lazily, top-p over a
bounded ``torch.topk`` head, each read row of p copied to float64 whole, the final token inverted through a cumsum of
the whole row.
now: ``verify_draft`` as the loop calls it: top-p's head by a threshold (``core/top_p_head.py``: the tokens within
2^-8 of the row's maximum, from 64-token block maxima; topk only for rows it does not settle), p's rows read in
their own dtype (float64 only for a rejection's residual and the final draw), the final inversion over the row's
blocks with mass.
batched: every fed row warped in one call (one softmax, one division over all of them), then the same host walk.
device walk (CPU): every row warped at once, then the device walk (``verify_tree(device_walk=True)``) on CPU tensors:
what an accelerator runs, timed here on the CPU.
old: the warp before the bounded head (a full descending sort of every row) on all n + 1 rows, then the walk with
multinomial: the first baseline. Each pass has its own generator (seeded by its index): every arm takes the same
paths (old's final token comes from another stream), before, now and batched the same next tokens: all checked.
Times are CPU seconds of this process (``time.process_time``; one thread), the median of ``--repeats`` interleaved
repeats (the arms in turn within each). Also the warp alone (before and now checked equal, bit for bit).

Logits are random (``--scale`` times a standard normal) or, with ``--model zoo:smollm2``, the target's own rows
over its sampled answers to Spec-Bench questions (n + 1 consecutive rows a pass); the kept nucleus sizes are
printed. Drafts are chains and trees of n = 0, 4, 12 nodes whose tokens are drawn from q = warp(logits + ``--tilt``
noise), or from q = p (``--tilt 0``: every node accepted, the walk reads every row: the worst case for warping
lazily); and ``det`` chains and trees of 4: q = None, each token the argmax of its parent's row (the target's greedy
continuation: the deterministic drafts of prompt lookup, suffix, Medusa and EAGLE, as benchmarks/pass_goals.py feeds).

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
from specfamily.core.sampling import TOP_P_START, WIDEN, head_keep, top_k_filter, warp
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


def topk_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The warp before the threshold head: top-p over a ``torch.topk`` head of every row, widened until settled."""
    scaled = logits.float() / sampling.temperature
    probs = torch.softmax(top_k_filter(scaled, sampling.top_k), dim=-1)
    if sampling.top_p >= 1.0:
        return probs
    rows = probs.reshape(-1, probs.shape[-1])
    k = min(sampling.top_k + 1 if sampling.top_k > 0 else TOP_P_START, rows.shape[-1])
    kept, done = head_keep(rows, k, sampling.top_p, values=True)
    pending = (~done).nonzero().view(-1)
    while pending.numel():
        k = min(WIDEN * k, rows.shape[-1])
        head, done = head_keep(rows[pending], k, sampling.top_p, values=True)
        kept[pending] = head
        pending = pending[~done]
    return kept.div_(kept.sum(dim=-1, keepdim=True)).view(probs.shape)


class WholeRowDraws(host.HostDraws):
    """The final token by inversion through a float64 cumsum of the whole row (before the blocks with mass)."""

    def sample(self, probs: torch.Tensor) -> int:
        cdf = probs.double().cumsum(0)
        index = int(torch.searchsorted(cdf, cdf.new_tensor([self.uniform() * cdf[-1].item()]), right=True))
        return index if index < probs.numel() else int(torch.nonzero(probs).max())


def before_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """verify_draft as session 19 left it: lazy rows warped over a topk head, each copied to float64 whole, the final
    token inverted through the whole row."""
    tokens, parents, q = draft.tokens, draft.parents, draft.q
    verify_module._check_shapes(tokens.numel(), tuple(logits.shape), q)
    q64 = None
    if q is not None:
        check_q(q)
        q64 = verify_module.Rows(lambda i: q[i].double())
    p64 = verify_module.Rows(lambda i: topk_warp(logits[i : i + 1], sampling)[0].double())
    return _walk(_children(parents.tolist()), tokens.tolist(), q64, p64, WholeRowDraws(generator))


def batched_verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[list[int], int]:
    """Every fed row warped in one call, then the host walk."""
    return verify_tree(draft.tokens, draft.parents, draft.q, warp(logits, sampling), generator, device_walk=False)


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
    """Plain decoding's CPU ms per new token: greedy, sampled with the topk-head warp (before; the walk of now),
    sampled now (the same texts); interleaved, ``repeats`` rounds over the first ``count`` questions, ``tokens`` new
    tokens each."""
    import specfamily as sf
    from specfamily.core import acceptance

    target = sf.load_target(name)
    prompts = [prompt_ids(target, turn) for turn in questions(path, count)]
    settings = {"greedy": (SamplingConfig(), warp), "sampled, before": (sampling, topk_warp),
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
    """``count`` (draft, logits (n + 1, V)) pairs; tokens drawn from their q rows (shapes ``chain``, ``tree``), or
    q = None and each token its parent row's argmax (``det chain``, ``det tree``); logits n + 1 consecutive rows of
    ``pool`` (R, V), or random."""
    gen = torch.Generator().manual_seed(n * 100 + len(shape))
    parents = torch.tensor(list(range(-1, n - 1)) if shape.endswith("chain") else TREES[n], dtype=torch.long)
    out = []
    for i in range(count):
        if pool is None:
            logits = scale * torch.randn(n + 1, vocab, generator=gen)
        else:
            at = (i * 7) % (pool.shape[0] - n)
            logits = pool[at : at + n + 1]
        if n == 0 or shape.startswith("det"):
            tokens = logits[parents + 1].argmax(dim=-1) if n else torch.zeros(0, dtype=torch.long)
            out.append((Draft(tokens=tokens, parents=parents, q=None), logits))
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
            for name, fn in (("old", old_warp), ("before", topk_warp), ("now", warp)):
                times[name].append(warp_ms(fn, logits[:rows], sampling, 10))
        old, before, new = (statistics.median(times[name]) for name in ("old", "before", "now"))
        if not torch.equal(topk_warp(logits[:rows], sampling), warp(logits[:rows], sampling)):
            raise SystemExit("the warp changed its values")
        print(f"| per call | {rows} | {old:.3f} | {before:.3f} | {new:.3f} | {before / new:.2f}x |")

    verifiers = {"old": old_verify, "before": before_verify, "now": verify_draft, "batched": batched_verify,
                 "device": device_verify}
    print("\n| pass | n | accepted (mean) | old ms | before ms | now ms | batched ms | device walk (CPU) ms | "
          "before / now |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    shapes = ((0, "chain"), (4, "det chain"), (4, "det tree"), (4, "chain"), (4, "tree"), (12, "chain"), (12, "tree"))
    for n, shape in shapes:
        cases = make_drafts(n, shape, args.passes, pool, args.vocab, args.scale, args.tilt, sampling)
        ms, out = per_pass_ms(verifiers, cases, sampling, args.repeats)
        paths = {name: [path for path, _ in outputs] for name, outputs in out.items()}
        if not paths["old"] == paths["now"] or not out["before"] == out["now"] == out["batched"]:
            raise SystemExit(f"paths differ at n = {n} ({shape})")
        accepted = statistics.mean(len(path) for path in paths["now"])
        print(f"| {shape} | {n} | {accepted:.2f} | {ms['old']:.2f} | {ms['before']:.2f} | {ms['now']:.2f} | "
              f"{ms['batched']:.2f} | {ms['device']:.2f} | {ms['before'] / ms['now']:.2f}x |")


if __name__ == "__main__":
    main()
