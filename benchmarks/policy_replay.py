"""The cost-aware policy's decisions with the clocks taken out: passes, tokens and a priced speedup per drafter.

Each request runs through ``sf.generate`` with the drafter at its defaults, but its ``AutoPolicy`` is told an idle
cost table instead of what the run's passes took: every timed pass costs ``PLAIN_SECONDS * TABLE(g) * scale`` (g
draft tokens; the plain pass unscaled), every drafted pass reports ``c`` and no catch-up but ``--start`` plain passes
on a request's first (a draft model's prompt prefill), priced once per request that drafts. What it drafts then depends
on the text and the policy alone, so two policies (``--baseline``: another ``policy.py``, e.g. main's from ``git show
main:specfamily/core/policy.py > /tmp/policy_main.py``) are compared pass for pass on any machine, loaded or not.
``--settings`` lists ``c:scale`` pairs: how dear a draft step and a drafted pass are (scale 1.03: every drafted pass
3% dearer than the table, as a loaded or two-thread run measures them). Priced speedup = plain passes over
sum(TABLE(g) * scale + c * g) over the passes. Greedy text is checked against plain decoding.

    python benchmarks/policy_replay.py --drafters prompt_lookup,suffix --max-prompt-tokens 0 --max-new-tokens 128 \
        --settings 0.002:1.0,0.01:1.03 --baseline /tmp/policy_main.py
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from common import quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core.costs import CostCurve
from specfamily.core.policy import AutoPolicy

# t(g + 1) / t(1) measured here (session 24, zoo:smollm2, stream, one thread, 256 cached tokens)
TABLE = {0: 1.0, 1: 1.022, 2: 1.017, 3: 1.026, 4: 1.047, 5: 1.076, 6: 1.094, 8: 1.163, 10: 1.232, 12: 1.282,
         16: 1.828, 24: 2.26, 32: 2.884}
PLAIN_SECONDS = 0.040


class Priced:
    """An auto policy told the table's costs (``timed``) and a fixed c (``update``) instead of measured ones."""

    def __init__(self, inner, c: float, scale: float, start: float = 0.0) -> None:
        self.inner, self.c, self.scale, self.curve = inner, c, scale, CostCurve.of(TABLE)
        self.start, self.fresh = start, True
        self.verify_cost = None

    def reset(self) -> None:
        self.inner.reset()
        self.fresh = True

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def bind(self, cost) -> None:
        self.inner.bind(cost)

    def timed(self, tokens: int, seconds: float) -> None:
        self.inner.timed(tokens, PLAIN_SECONDS * self.curve(tokens) * (self.scale if tokens else 1.0))

    def update(self, proposed, accepted, c=None, tokens=None, verified=None, overhead=None) -> None:
        drafted = proposed > 0
        overhead = None
        if drafted:  # a request's first drafted pass pays the start (as a draft model's prompt prefill), in
            overhead, self.fresh = (self.start if self.fresh else 0.0) / self.curve(tokens or proposed), False
        self.inner.update(proposed, accepted, self.c if drafted else None, tokens, verified, overhead)


def load_policy(path: str) -> type:
    spec = importlib.util.spec_from_file_location("baseline_policy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_policy"] = module
    spec.loader.exec_module(module)
    return module.AutoPolicy


def requests(args) -> tuple:
    """(target, prompts, their plain greedy texts): ``zoo:smollm2`` with the stream kernel on one thread, the first
    ``args.requests`` Spec-Bench first turns (one a category), each cut to its last ``args.max_prompt_tokens`` (0:
    whole), decoded plainly for ``args.max_new_tokens``."""
    set_threads(1)
    quiet_transformers()
    target = sf.load_target("zoo:smollm2", matmul="stream")
    prompts, _ = spec_bench_prompts(1, target.tokenizer)
    prompts = [p[-args.max_prompt_tokens :] if args.max_prompt_tokens else p for p in prompts][: args.requests]
    plain = [sf.generate(target, None, p, args.max_new_tokens, seed=i).tokens for i, p in enumerate(prompts)]
    return target, prompts, plain


def replay(target, name: str, cls: type, prompts, plain, args, c: float, scale: float, start: float) -> str:
    curve = CostCurve.of(TABLE)
    drafter = sf.create_drafter(name, target)
    own = drafter.policy
    drafter.policy = Priced(cls(own.gamma, max_gamma=own.max_gamma), c, scale, start)
    passes = fed = accepted = 0
    cost = 0.0
    for i, prompt in enumerate(prompts):
        result = sf.generate(target, drafter, prompt, args.max_new_tokens, seed=i)
        if result.tokens != plain[i]:
            raise AssertionError(f"{name}: request {i} differs from plain decoding")
        cost += start if any(len(draft) for draft in result.trace.draft_tokens) else 0.0
        for draft, path in zip(result.trace.draft_tokens, result.trace.accepted, strict=True):
            passes, fed, accepted = passes + 1, fed + len(draft), accepted + len(path)
            cost += curve(len(draft)) * scale + c * len(draft) if draft else 1.0
    total = sum(map(len, plain))
    return (f"passes {passes} (plain {total}), draft tokens fed {fed}, accepted {accepted}, tau {total / passes:.2f}, "
            f"priced speedup {total / cost:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafters", default="prompt_lookup,suffix")
    parser.add_argument("--requests", type=int, default=2, help="the first N Spec-Bench first turns, one a category")
    parser.add_argument("--max-prompt-tokens", type=int, default=0, help="keep each prompt's last N tokens; 0: whole")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--settings", default="0.002:1.0,0.01:1.03", help="c:scale pairs")
    parser.add_argument("--start", type=float, default=0.0,
                        help="a request's first drafted pass's catch-up, in plain passes (a draft model's prompt)")
    parser.add_argument("--baseline", default="", help="another policy.py whose AutoPolicy to replay beside this one")
    args = parser.parse_args(argv)
    target, prompts, plain = requests(args)
    target.verify_costs = dict(TABLE)
    policies = [("this", AutoPolicy)] + ([("baseline", load_policy(args.baseline))] if args.baseline else [])
    for setting in args.settings.split(","):
        c, scale = (float(x) for x in setting.split(":"))
        for name in args.drafters.split(","):
            for label, cls in policies:
                print(f"c {c:g} scale {scale:g} {name} {label}: "
                      f"{replay(target, name, cls, prompts, plain, args, c, scale, args.start)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
