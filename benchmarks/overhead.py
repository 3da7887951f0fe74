"""Our decode loop's overhead against transformers ``generate`` and against the bare model.

One target, one draft, one run: plain greedy decoding (ours, ``generate()``, and a bare greedy
loop over the model, the floor) and speculative decoding with the draft (ours at a constant gamma,
``generate(assistant_model=draft)`` at the same constant gamma), as time ratios with outputs
checked token for token. Also where our time goes (draft / verify / other per token).

    python benchmarks/overhead.py --target DIR --draft DIR --threads 2
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from dataclasses import dataclass

import common
from common import Method, PairResult


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:code-target")
    parser.add_argument("--draft", default="zoo:code-draft")
    parser.add_argument("--prompts", default=None, help="jsonl prompt set (default: the zoo's held-out 'continue')")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=common.CLOCKS, default="wall")
    parser.add_argument("--out", default=None, help="write the JSON report here")
    return parser.parse_args(argv)


@dataclass
class Split:
    """Our time per new token, split as the loop's metrics split it (ms)."""

    draft: float
    verify: float
    other: float


def time_split(target, drafter, prompts: list[list[int]], max_new_tokens: int) -> Split:
    """Sum the loop's own draft / verify / other timings over the prompts."""
    import specfamily as sf

    runs = [sf.generate(target, drafter, prompt, max_new_tokens=max_new_tokens).metrics for prompt in prompts]
    scale = 1000 / max(sum(m.new_tokens for m in runs), 1)
    total = lambda key: scale * sum(getattr(m, key) for m in runs)  # noqa: E731
    return Split(total("draft_seconds"), total("verify_seconds"), total("other_seconds"))


def methods(target, draft, gamma: int, max_new_tokens: int) -> list[Method]:
    """The rows: plain (vs generate, and the bare loop vs generate), and the draft at a constant gamma."""
    import specfamily as sf
    from specfamily.core.target import Target

    model = target.model
    plain_hf = lambda p: common.hf_generate(model, p, max_new_tokens)  # noqa: E731
    bare = common.raw_greedy(model, max_new_tokens)
    slow = Target(model, target.tokenizer, fast=False)
    rows = [
        Method("plain", common.stateless(common.ours_fn(target, None, max_new_tokens)), plain_hf, "plain generate"),
        Method("plain, transformers forward", common.stateless(common.ours_fn(slow, None, max_new_tokens)), plain_hf,
               "plain generate", "our loop without the lean forward"),
        Method("bare model loop", common.stateless(common.as_ours(bare)), plain_hf, "plain generate",
               "greedy loop over model()"),
    ]
    if draft is not None:
        make = lambda: sf.create_drafter("small_model", target, model=draft, gamma=gamma)  # noqa: E731
        config = copy.deepcopy(draft.generation_config)
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
        config.assistant_confidence_threshold = 0.0

        def assisted(prompt):
            draft.generation_config = config
            return common.hf_generate(model, prompt, max_new_tokens, assistant_model=draft)

        rows.append(Method(f"small_model gamma={gamma}", common.ours_factory(target, make, max_new_tokens), assisted,
                           f"assisted, constant {gamma}"))  # a new drafter for the warm-up and each repeat
    return rows


def run(args: argparse.Namespace) -> dict:
    """Fix the threads, load the pair and the prompts, then measure."""
    from specfamily.zoo import prompt_set_path

    common.set_threads(args.threads)
    common.quiet_transformers()
    target, draft = common.load_pair(args.target, args.draft)
    prompts = common.load_prompts(args.prompts or prompt_set_path("continue"), args.count, target.tokenizer)
    return measure(target, draft, prompts, args)


def measure(target, draft, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Measure the rows and our time split; returns the JSON report (with its Markdown)."""
    clock = common.make_clock(args.clock)
    reference = [common.hf_generate(target.model, p, args.tokens) for p in prompts]
    results: list[PairResult] = []
    for method in methods(target, draft, args.gamma, args.tokens):
        results.append(common.measure_pair(method, prompts, args.repeats, clock, reference))
        print(common.markdown_table(results[-1:]).splitlines()[-1], flush=True)
    splits = {r.name: time_split(target, _drafter_of(r, target, draft, args.gamma), prompts, args.tokens)
              for r in results if r.name in ("plain", f"small_model gamma={args.gamma}")}
    report = {"environment": common.environment(args.threads, args.clock), "config": vars(args),
              "rows": [r.summary() for r in results], "split_ms_per_token": {k: vars(v) for k, v in splits.items()}}
    report["markdown"] = render(report, results, splits)
    return report


def _drafter_of(result: PairResult, target, draft, gamma: int):
    import specfamily as sf

    if result.name == "plain":
        return None
    return sf.create_drafter("small_model", target, model=draft, gamma=gamma)


def render(report: dict, results: list[PairResult], splits: dict[str, Split]) -> str:
    env = report["environment"]
    by_name = {r.name: r for r in results}
    lines = [
        f"`{env['command']}` - {env['cpu']}, {env['threads']} thread(s), {env['clock']} clock; "
        f"torch {env['torch']}, transformers {env['transformers']}",
        "",
        common.markdown_table(results),
        "",
    ]
    if {"plain", "plain, transformers forward", "bare model loop"} <= by_name.keys():
        ours, slow, bare = (statistics.median(by_name[k].ours_ms) for k in
                            ("plain", "plain, transformers forward", "bare model loop"))
        lines.append(f"Plain decoding, ms/token: ours {ours:.2f}; ours through transformers' forward {slow:.2f}; "
                     f"a bare greedy loop over model() {bare:.2f}. Loop overhead over the bare loop: "
                     f"{slow - bare:+.2f} ms/token; the lean forward saves {slow - ours:.2f} ms/token.")
    for name, split in splits.items():
        lines.append(f"Our split (the loop's own wall-clock timers), {name}: draft {split.draft:.2f}, "
                     f"verify {split.verify:.2f}, other {split.other:.2f} ms/token")
    lines += common.describe_mismatches(results)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print()
    print(report["markdown"])
    if args.out:
        common.write_json(args.out, report)
    return 0 if all(r["identical"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
