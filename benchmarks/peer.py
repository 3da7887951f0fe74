"""The performance gauge: specfamily against transformers on the same target, draft and prompts.

Batch 1, greedy, a fixed thread count. Each row pairs our decoding with the closest transformers
feature (plain ``generate``, ``assistant_model=``, ``prompt_lookup_num_tokens=``,
``assistant_early_exit=``; plain ``generate`` for drafters transformers does not have), checks the
outputs are identical token for token, and reports ms per new token, the ratio (theirs / ours;
> 1 means ours is faster) and tau. Every drafter row also times our plain decoding beside it, prompt
by prompt (ours with the drafter, ours plain, transformers on prompt 1; then prompt 2; ...; the order
rotating), so its speedup over our plain decoding ("over our plain") and the ratio come from paired
measurements of one run, median [min-max] over ``--repeats``; each repeat builds the drafter afresh
(``pairs``: no timed request is served by a drafter that has seen it). The oracle drafter (replays
the target's own greedy output) shows the loop's ceiling next to the ceiling from the target's own
pass costs t(n).

    python benchmarks/peer.py                                   # the zoo pair, held-out prompts
    python benchmarks/peer.py --target DIR --draft DIR --threads 1 --clock cpu --out peer.json
    python benchmarks/peer.py --target zoo:smollm2 --draft none --prompts spec_bench --count 1 --defaults
    python benchmarks/peer.py --target zoo:smollm2 --draft none --only plain,eagle,eagle3 --eagle3-weights DIR

The eagle3 rows (tree, chain) take ``--eagle3-weights`` (any layout ``create_drafter("eagle3")`` loads, or a hub
name), else the zoo's EAGLE-3 for the target (``zoo:smollm2-eagle3``); without either the table says why they are
missing.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict

import common
from ceiling import oracle_ceiling, oracle_lines
from common import Method, PairResult, Skipped
from peer_rows import modes_vs_plain, oracle_row, plain_vs_ours, policy_note, self_spec_row
from peer_setup import Setup, make_setup, prepare  # noqa: F401 - prepare and make_setup are this script's API

SMALL_GAMMAS = (1, 2, 3, 4, 6, 8)
LOOKUP_GAMMAS = (2, 4, 6, 8, 10)
HF_CONFIDENCE = 0.4  # transformers' default assistant_confidence_threshold
HF_LOOKUP_TOKENS = 10  # the prompt_lookup_num_tokens transformers' docs use
ORDER = ("small_model", "prompt_lookup", "self_spec", "medusa", "eagle", "eagle3")  # table order; other drafters follow


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:code-target")
    parser.add_argument("--draft", default="zoo:code-draft", help="draft model, or 'none'")
    parser.add_argument("--prompts", default=None, help="jsonl prompt set, or spec_bench (Spec-Bench first turns, "
                        "chat template; --count per category); default: the zoo's held-out 'continue'")
    parser.add_argument("--count", type=int, default=8, help="prompts used (spec_bench: per category)")
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed alternating repeats per pair")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=common.CLOCKS, default="wall")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the wall clock synchronises with it)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="default: float32 on cpu, the weights' own dtype on a GPU")
    common.add_matmul_option(parser)
    parser.add_argument("--gamma", type=int, default=None, help="small_model gamma (default: fastest of a sweep)")
    parser.add_argument("--lookup-gamma", type=int, default=None, help="prompt_lookup gamma (default: sweep)")
    parser.add_argument("--oracle-gamma", type=int, default=4)
    parser.add_argument("--eagle3-weights", default=None, metavar="DIR",
                        help="an EAGLE-3 drafter (folder in our, EAGLE/SpecForge or speculators layout, or a hub "
                             "name) for the eagle3 rows; default: the zoo's for the target, if it has one")
    parser.add_argument("--early-exit", type=int, default=None, help="layers of transformers' early-exit assistant")
    parser.add_argument("--option", action="append", default=[], metavar="NAME.KEY=VALUE",
                        help="extra option for our drafter NAME (value parsed as JSON when it can be)")
    parser.add_argument("--defaults", action="store_true",
                        help="prompt_lookup and self_spec at our defaults (cost-aware gamma) against transformers' "
                             "defaults (prompt lookup of 10 tokens, early exit with its default schedule)")
    parser.add_argument("--only", default=None, help="comma-separated rows to run (plain,small_model,...,oracle)")
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("--markdown", default=None, help="write the Markdown report here")
    return parser.parse_args(argv)


def drafter_options(specs: list[str]) -> dict[str, dict]:
    """``["medusa.weights=random", "eagle.gamma=5"]`` -> {"medusa": {"weights": "random"}, "eagle": {"gamma": 5}}."""
    options: dict[str, dict] = {}
    for spec in specs:
        name, sep, rest = spec.partition(".")
        key, eq, value = rest.partition("=")
        if not (sep and eq and name and key):
            raise ValueError(f"--option takes NAME.KEY=VALUE, got {spec!r}")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        options.setdefault(name, {})[key] = parsed
    return options


def calibrate(setup: Setup, make, gammas) -> tuple[int, dict[int, float]]:
    """The gamma with the least ms/token of ours on the first two prompts (one warm-up on a drafter object of its
    own, so the timed one has seen neither prompt; then one timed run each)."""
    prompts, timings = setup.prompts[:2], {}
    for gamma in gammas:
        if gamma >= setup.max_new_tokens:
            continue
        side = setup.ours(lambda gamma=gamma: make(gamma))
        side()(prompts[0])
        run = side()
        start, tokens = setup.clock(), 0
        for prompt in prompts:
            tokens += len(run(prompt).tokens)
        timings[gamma] = 1000 * (setup.clock() - start) / max(tokens, 1)
    return min(timings, key=timings.get), timings


def small_model_rows(setup: Setup, options: dict, report: dict) -> list[Method]:
    import specfamily as sf

    target, draft = setup.target, setup.draft
    options = dict(options)
    threshold = options.pop("confidence", HF_CONFIDENCE)  # the constant rows draft gamma tokens every time

    def make(g: int, confidence: float = 0.0):
        options_g = {**options, "gamma": g, "confidence": confidence}
        return sf.create_drafter("small_model", target, model=draft, **options_g)

    gamma = setup.args.gamma or options.get("gamma")
    if gamma is None:
        gamma, timings = calibrate(setup, make, SMALL_GAMMAS)
        report["calibration"]["small_model"] = timings
    default_config = copy.deepcopy(draft.generation_config)
    constant = copy.deepcopy(draft.generation_config)
    constant.num_assistant_tokens, constant.num_assistant_tokens_schedule = gamma, "constant"
    constant.assistant_confidence_threshold = 0.0  # a truly constant draft length, as ours

    def assisted(config):
        def run(prompt):
            draft.generation_config = config
            return common.hf_generate(target.model, prompt, setup.max_new_tokens, assistant_model=draft)

        return run

    # transformers' default ends each draft early below a draft confidence of 0.4 (adapted as it goes): ours
    # with the same fixed threshold faces it, ours with a constant length faces its constant schedule
    confident, ours = setup.ours(lambda: make(gamma, threshold)), setup.ours(lambda: make(gamma))
    return [
        Method(f"small_model gamma={gamma} confidence={threshold}", confident, assisted(default_config),
               "assisted, default schedule", plain=setup.plain()),
        Method(f"small_model gamma={gamma}", ours, assisted(constant), f"assisted, constant {gamma}",
               plain=setup.plain()),
    ]


def prompt_lookup_row(setup: Setup, options: dict, report: dict) -> Method:
    import specfamily as sf

    if setup.args.defaults:
        default = lambda: sf.create_drafter("prompt_lookup", setup.target, **options)  # noqa: E731
        drafter = default()
        ngram = drafter.config.max_ngram
        theirs = setup.hf(prompt_lookup_num_tokens=HF_LOOKUP_TOKENS, max_matching_ngram_size=ngram)
        return Method("prompt_lookup default", setup.ours(default), theirs,
                      f"prompt lookup {HF_LOOKUP_TOKENS}, ngram {ngram}", f"ours: {policy_note(drafter)}",
                      setup.plain())
    make = lambda g: sf.create_drafter("prompt_lookup", setup.target, **{**options, "gamma": g})  # noqa: E731
    gamma = setup.args.lookup_gamma or options.get("gamma")
    if gamma is None:
        gamma, timings = calibrate(setup, make, LOOKUP_GAMMAS)
        report["calibration"]["prompt_lookup"] = timings
    ngram = getattr(getattr(make(gamma), "config", None), "max_ngram", 2)
    theirs = setup.hf(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram)
    return Method(f"prompt_lookup gamma={gamma}", setup.ours(lambda: make(gamma)), theirs,
                  f"prompt lookup {gamma}, ngram {ngram}", plain=setup.plain())


def build_rows(setup: Setup, report: dict) -> tuple[list, list[Skipped]]:
    """(rows as (name, builder) pairs in table order, drafters skipped before measuring)."""
    import specfamily as sf

    options = drafter_options(setup.args.option)
    rows = [("plain", lambda: [Method("plain", common.stateless(setup.plain()), setup.hf(), "plain generate")])]
    builders = {
        "small_model": lambda: small_model_rows(setup, options.get("small_model", {}), report),
        "prompt_lookup": lambda: [prompt_lookup_row(setup, options.get("prompt_lookup", {}), report)],
        "self_spec": lambda: [self_spec_row(setup, options.get("self_spec", {}))],
        "medusa": lambda: modes_vs_plain(setup, "medusa", options.get("medusa", {}),
                                         {"tree": {}, "chain": {"tree": "chain"}}),
        "eagle": lambda: modes_vs_plain(setup, "eagle", options.get("eagle", {}),
                                        {"tree": {"mode": "tree"}, "chain": {"mode": "chain"}}),
        "eagle3": lambda: modes_vs_plain(setup, "eagle3", eagle3_options(setup.args, options),
                                         {"tree": {"mode": "tree"}, "chain": {"mode": "chain"}}),
    }
    skipped = []
    names = sf.list_drafters()
    for name in [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]:
        reason = missing_input(setup, name, options)
        if reason is not None:
            skipped.append(Skipped(name, reason))
            print(f"skip {name}: {reason}", flush=True)
            continue
        build = builders.get(name) or (lambda n=name: [plain_vs_ours(setup, n, options.get(n, {}))])
        rows.append((name, build))
    rows.append(("oracle", lambda: [oracle_row(setup)]))
    if setup.args.only:
        wanted = set(setup.args.only.split(","))
        rows = [row for row in rows if row[0] in wanted]
    return rows, skipped


def eagle3_options(args: argparse.Namespace, options: dict) -> dict:
    """The eagle3 drafter's options: ``--eagle3-weights`` as its weights, ``--option eagle3.*`` over them."""
    return {"weights": args.eagle3_weights, **options.get("eagle3", {})}


def missing_input(setup: Setup, name: str, options: dict) -> str | None:
    """Why drafter ``name`` has no row without measuring it (an input it needs was not given); None: it has one."""
    if name == "small_model" and setup.draft is None:
        return "no --draft model"
    if name == "eagle3" and eagle3_options(setup.args, options)["weights"] is None:
        from specfamily import zoo

        try:
            zoo.default_weights("eagle3", setup.target)
        except ValueError:
            return "no --eagle3-weights, and the zoo has no EAGLE-3 for this target"
    return None


def measure_rows(setup: Setup, rows, skipped: list[Skipped]) -> list[PairResult]:
    """Build and measure each row; a row that fails to build or run is skipped with the reason printed."""
    results = []
    for name, build in rows:
        try:
            methods = build()
        except Exception as err:  # noqa: BLE001 - any failure to create is reported, never silent
            skipped.append(Skipped(name, f"could not be created: {type(err).__name__}: {err}"))
            print(f"skip {name}: {skipped[-1].reason}", flush=True)
            continue
        for method in methods:
            try:
                result = common.measure_pair(method, setup.prompts, setup.args.repeats, setup.clock, setup.reference)
            except Exception as err:  # noqa: BLE001
                skipped.append(Skipped(method.name, f"failed while running: {type(err).__name__}: {err}"))
                print(f"skip {method.name}: {skipped[-1].reason}", flush=True)
                continue
            results.append(result)
            print(common.markdown_table([result]).splitlines()[-1], flush=True)
    return results


def measure(setup: Setup) -> dict:
    """Measure every row; returns the JSON report, its Markdown included."""
    started = time.perf_counter()
    args = setup.args
    report = {"environment": {**common.environment(args.threads, args.clock), "matmul": setup.target.matmul},
              "calibration": {}, "config": vars(args)}
    rows, skipped = build_rows(setup, report)
    results = measure_rows(setup, rows, skipped)
    ceiling = oracle_ceiling(setup, results)
    report.update(rows=[r.summary() for r in results], skipped=[asdict(s) for s in skipped], oracle=ceiling,
                  seconds=time.perf_counter() - started)
    report["markdown"] = render(report, results, skipped, ceiling)
    return report


def render(report: dict, results: list[PairResult], skipped: list[Skipped], ceiling: dict | None) -> str:
    env = report["environment"]
    lines = [
        f"`{env['command']}` — {env['cpu']}, {env['threads']} thread(s), {env['clock']} clock, our matmul "
        f"{env.get('matmul', 'exact')}; "
        f"torch {env['torch']}, transformers {env['transformers']}, python {env['python']}",
        "",
        common.markdown_table(results, skipped),
        "",
        *oracle_lines(ceiling),
        *common.describe_mismatches(results),
    ]
    if report["calibration"]:
        for name, timings in report["calibration"].items():
            cells = ", ".join(f"{g}: {ms:.2f}" for g, ms in timings.items())
            lines.append(f"Calibration {name} (gamma: ours ms/token): {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    report = measure(prepare(args))
    print()
    print(report["markdown"])
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.out:
        common.write_json(args.out, report)
    if args.markdown:
        common.write_text(args.markdown, report["markdown"] + "\n")
    return 0 if all(r["identical"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
