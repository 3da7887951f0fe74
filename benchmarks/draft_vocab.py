"""How large a reduced draft vocabulary should be: one trained EAGLE layer drafting over its N most frequent tokens.

For each size (and "full": the target's whole LM head) and each mode, greedy decoding on Spec-Bench first turns is
timed against our plain decoding, alternating, in one run: tau, ms per token and the speedup (plain / ours). The
tokens must be identical to plain decoding in every row. A smaller N makes every draft step cheaper (the head is
N x H instead of V x H) and loses the tokens outside it.

    python benchmarks/draft_vocab.py --target zoo:smollm2 --sizes full,16384,8192,4096 --count 1 --tokens 64 --gamma 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--weights", default=None, help="eagle weights (default: the zoo's for the target)")
    parser.add_argument("--sizes", default="full,16384,8192,4096", help="comma-separated: full or N")
    parser.add_argument("--modes", default="tree,chain")
    parser.add_argument("--gamma", type=int, default=None,
                        help="a fixed draft length (depth for trees), so that tau measures the vocabulary's "
                             "acceptance; default: cost-aware, which may draft nothing")
    parser.add_argument("--count", type=int, default=1, help="Spec-Bench questions per category")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    common.add_matmul_option(parser)
    parser.add_argument("--out", default=None, help="write the JSON report here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import specfamily as sf

    args = parse_args(argv)
    common.set_threads(args.threads)
    common.quiet_transformers()
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, _ = common.spec_bench_prompts(args.count, target.tokenizer)
    plain = common.ours_fn(target, None, args.tokens)
    reference = [plain(p).tokens for p in prompts]
    clock = common.make_clock("wall")
    results = []
    for mode in args.modes.split(","):
        for size in args.sizes.split(","):
            vocab = "full" if size == "full" else int(size)
            def make(mode=mode, vocab=vocab):  # a new drafter for the warm-up and each repeat (benchmarks/pairs.py)
                return sf.create_drafter("eagle", target, weights=args.weights, mode=mode, draft_vocab=vocab,
                                         gamma=args.gamma)

            method = common.Method(f"eagle {mode} N={size}", common.ours_factory(target, make, args.tokens),
                                   lambda p: plain(p).tokens, "our plain decoding")
            result = common.measure_pair(method, prompts, args.repeats, clock, reference)
            results.append(result)
            print(common.markdown_table([result]).splitlines()[-1], flush=True)
    table = common.markdown_table(results)
    print(table)
    if args.out:
        report = {"environment": {**common.environment(args.threads, "wall"), "matmul": target.matmul},
                  "config": vars(args),
                  "rows": [r.summary() for r in results], "markdown": table}
        common.write_json(args.out, report)
    return 0 if all(r.identical for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
