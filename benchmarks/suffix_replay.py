"""Teacher-forced replay of deterministic drafters at temperature 0: tau without running the target again.

Under greedy decoding a lossless run commits exactly the plain greedy continuation, so what the tree verifier
accepts at each pass depends only on that text and on the drafter's proposal: the longest proposed path that
equals the next greedy tokens, plus the target's (bonus) token after it. :func:`replay` takes the greedy
continuation once (:func:`greedy_continuations`, cached in a JSON file) and drives a drafter through the same
begin / propose / observe / end calls and the same token budget and EOS rule as ``sf.generate``, so passes and
tau are those of a real run (a test holds it to a real run on a tiny target) at any machine load. It needs a
policy that does not read the clock (a constant gamma); its times are the drafter's proposal times only.

    python benchmarks/suffix_replay.py --per-category 5 --max-new-tokens 128 --gamma 4 --greedy work/greedy.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

import specfamily as sf
from specfamily.core.context import DecodeContext
from specfamily.core.loop import truncate
from specfamily.core.types import Draft, SamplingConfig, VerifyOutcome
from specfamily.core.verify import greedy_tree
from specfamily.io.files import write_text_atomically


@dataclass
class Replayed:
    """One drafter's sums over replayed prompts."""

    tokens: int = 0
    passes: int = 0
    proposed: int = 0
    draft_steps: int = 0
    draft_seconds: float = 0.0  # every propose call's, empty drafts included

    @property
    def tau(self) -> float:
        return self.tokens / self.passes if self.passes else float("nan")

    def add(self, other: Replayed) -> None:
        for name in ("tokens", "passes", "proposed", "draft_steps", "draft_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def prompt_key(target_name: str, ids: Sequence[int], max_new_tokens: int) -> str:
    text = json.dumps([target_name, list(ids), max_new_tokens])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def greedy_continuations(target, target_name: str, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         path: str | Path | None = None) -> list[list[int]]:
    """Plain greedy decoding of each prompt (``max_new_tokens``, EOS included), read from / added to ``path``."""
    path = Path(path) if path is not None else None
    stored: dict = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    out = []
    for ids in prompts:
        key = prompt_key(target_name, ids, max_new_tokens)
        if key not in stored:
            stored[key] = sf.generate(target, None, list(ids), max_new_tokens=max_new_tokens).tokens
            if path is not None:
                write_text_atomically(path, json.dumps(stored))
        out.append(list(stored[key]))
    return out


def accepted_path(draft: Draft, greedy: Sequence[int], start: int) -> tuple[list[int], int]:
    """What the greedy tree verifier accepts of ``draft`` when the target's greedy text from ``start`` on is
    ``greedy[start:]``: (accepted node indices, the target's token after them)."""
    depths = draft.depths().tolist() if len(draft) else []
    after = [start, *(start + d for d in depths)]  # position of the token each row of logits predicts
    argmax = torch.tensor([greedy[i] if i < len(greedy) else -1 for i in after], dtype=torch.long)
    return greedy_tree(draft.tokens, draft.parents, argmax)


def replay(drafter, ctx_target, prompt: Sequence[int], greedy: Sequence[int], max_new_tokens: int) -> Replayed:
    """One request of ``drafter`` replayed against its greedy continuation (see the module docstring)."""
    ids = torch.tensor(list(prompt), dtype=torch.long)
    ctx = DecodeContext(ctx_target, ids, SamplingConfig(), torch.Generator().manual_seed(0), tokens=list(prompt))
    out, new = Replayed(), 0
    drafter.begin(ctx)
    try:
        while new < max_new_tokens:
            remaining = max_new_tokens - new
            gamma = min(drafter.policy.next_gamma(), remaining - 1)
            t0 = time.perf_counter()
            draft = drafter.propose(ctx, gamma) if gamma > 0 else Draft.empty()
            seconds = time.perf_counter() - t0
            accepted, bonus = accepted_path(draft, greedy, new)
            out.passes, out.draft_seconds = out.passes + 1, out.draft_seconds + seconds
            if len(draft):
                out.proposed, out.draft_steps = out.proposed + len(draft), out.draft_steps + 1
            committed = [*(int(draft.tokens[i]) for i in accepted), bonus]
            kept, finished = truncate(committed, remaining, ctx_target.eos_token_ids)
            new, out.tokens = new + len(kept), out.tokens + len(kept)
            ctx.tokens += kept
            if finished:
                break
            drafter.observe(VerifyOutcome(committed, accepted, len(draft)))
    finally:
        if hasattr(drafter, "end"):
            drafter.end()
    return out


@dataclass
class Workload:
    """Prompts (in order), their categories and greedy continuations."""

    prompts: list[list[int]]
    categories: list[str]
    greedy: list[list[int]]
    max_new_tokens: int
    results: dict[str, dict[str, Replayed]] = field(default_factory=dict)


def replay_workload(name: str, drafter, ctx_target, work: Workload) -> dict[str, Replayed]:
    """One drafter object over every prompt in order (a global cache carries across them); sums per category."""
    sums: dict[str, Replayed] = {"all": Replayed()}
    for prompt, category, greedy in zip(work.prompts, work.categories, work.greedy, strict=True):
        result = replay(drafter, ctx_target, prompt, greedy, work.max_new_tokens)
        sums["all"].add(result)
        sums.setdefault(category, Replayed()).add(result)
    work.results[name] = sums
    return sums


def table(work: Workload) -> str:
    """Tau per category (rows) and drafter (columns), and each drafter's mean proposal time per pass."""
    names = list(work.results)
    categories = list(dict.fromkeys(["all", *work.categories]))
    lines = ["| category | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for category in categories:
        cells = [f"{work.results[n][category].tau:.3f}" for n in names]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    us = [1e6 * r["all"].draft_seconds / max(1, r["all"].passes) for r in work.results.values()]
    lines.append("| us per propose call | " + " | ".join(f"{u:.0f}" for u in us) + " |")
    return "\n".join(lines)


def arms(gamma: int) -> dict[str, Callable]:
    """The drafters compared at the same maximum draft size ``gamma`` (constant policy)."""
    def suffix(**options):
        return lambda target: sf.create_drafter("suffix", target, gamma=gamma, max_tree_size=gamma, **options)

    return {
        "prompt_lookup": lambda target: sf.create_drafter("prompt_lookup", target, gamma=gamma),
        "suffix (paper)": suffix(max_spec_offset=0.0, max_spec_factor=1.0, choose="score"),
        "suffix": suffix(),
        "suffix chain": suffix(mode="chain"),
    }


def main(argv: Sequence[str] | None = None) -> Workload:
    import common

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4, help="the maximum draft size of every arm")
    parser.add_argument("--greedy", default="work/suffix-greedy.json", help="greedy continuations cache (JSON)")
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    common.quiet_transformers()
    target, _ = common.load_pair(args.target, None, matmul="auto")
    prompts, categories = common.spec_bench_prompts(args.per_category, target.tokenizer)
    greedy = greedy_continuations(target, args.target, prompts, args.max_new_tokens, args.greedy)
    work = Workload(prompts, categories, greedy, args.max_new_tokens)
    for name, make in arms(args.gamma).items():
        replay_workload(name, make(target), target, work)
    print(table(work), flush=True)
    return work


if __name__ == "__main__":
    main()
