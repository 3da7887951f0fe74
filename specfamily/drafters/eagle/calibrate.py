"""Choose the EAGLE drafting shape for this machine (a tree, or a chain) and write it into the checkpoint.

Each candidate (gamma, total_tokens), chains included, is measured through the shared loop (greedy, held-out prompts,
every output checked against plain decoding); the fastest becomes the checkpoint's default, with the whole table, in
``config.json`` under ``calibration``:

    python -m specfamily.drafters.eagle.calibrate --target zoo:code-target --weights DIR --threads 1
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specfamily.core.costs import process_clock
from specfamily.drafters.eagle.checkpoint import load_eagle
from specfamily.drafters.eagle.storage import CONFIG_FILE, resolve_weights
from specfamily.drafters.shared.greedy_tau import greedy_run
from specfamily.io.files import write_text_atomically
from specfamily.runtime.matmul import MATMUL_KINDS

# (gamma, total_tokens); the smallest trees are for targets whose verify cost climbs steeply after a few tokens
CANDIDATES = ((2, 2), (3, 3), (3, 4), (4, 5), (4, 6), (4, 8), (5, 8), (5, 12), (6, 16), (6, 24))
CHAINS = (2, 3, 4, 5)  # chain lengths tried


@dataclass
class Trial:
    gamma: int
    total_tokens: int
    tau: float
    seconds: float
    speedup: float  # plain seconds / these seconds, same prompts, same run
    identical: bool
    mode: str = "tree"  # a chain's total_tokens is its length


def measure_trials(target, model, prompts: list[list[int]], new_tokens: int,
                   candidates=CANDIDATES, chains=CHAINS) -> tuple[list[Trial], float]:
    """Each candidate's tau and time over ``prompts`` against plain decoding (timed first); plain seconds too."""
    from specfamily.drafters.eagle.drafter import EagleDrafter

    clock = process_clock(target.device)
    greedy_run(target, None, prompts[:1], 8, clock)  # warm-up
    plain, _, base = greedy_run(target, None, prompts, new_tokens, clock)
    trials = []
    shapes = [("tree", gamma, total) for gamma, total in candidates] + [("chain", g, g) for g in chains]
    for mode, gamma, total in shapes:
        drafter = EagleDrafter(target, weights=model, gamma=gamma, total_tokens=total, mode=mode)
        greedy_run(target, drafter, prompts[:1], 8, clock)
        outputs, tau, seconds = greedy_run(target, drafter, prompts, new_tokens, clock)
        trials.append(Trial(gamma, total, tau, seconds, base / seconds, outputs == plain, mode))
    return trials, base


def best_trial(trials: list[Trial]) -> Trial:
    """The fastest candidate whose outputs all equal plain decoding."""
    exact = [t for t in trials if t.identical]
    if not exact:
        raise RuntimeError("no EAGLE tree shape reproduced plain greedy decoding; this is a bug, please report it")
    return max(exact, key=lambda t: t.speedup)


def write_calibration(weights: str | Path, trials: list[Trial], plain_seconds: float, info: dict) -> Trial:
    """Record the table and the chosen shape in the checkpoint's config.json (atomically)."""
    folder = resolve_weights(weights)
    config = json.loads((folder / CONFIG_FILE).read_text())
    best = best_trial(trials)
    config["calibration"] = {"mode": best.mode, "gamma": best.gamma, "total_tokens": best.total_tokens,
                             "plain_seconds": plain_seconds, "trials": [asdict(t) for t in trials], **info}
    write_text_atomically(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return best


def main(argv: list[str] | None = None) -> Trial:
    parser = argparse.ArgumentParser(prog="python -m specfamily.drafters.eagle.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--weights", required=True, help="the EAGLE checkpoint folder (rewritten in place)")
    parser.add_argument("--prompts", default="continue", help="zoo prompt set: complete, continue or instruct")
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="auto", choices=MATMUL_KINDS,
                        help="the target's products, as decoding will multiply (specfamily.runtime.matmul)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specfamily.core.target import load_target
    from specfamily.zoo import prompt_ids

    target = load_target(args.target, matmul=args.matmul)  # float32 on the CPU, the checkpoint's dtype on a GPU
    model, _ = load_eagle(args.weights, target.model)
    prompts = prompt_ids(args.prompts, args.count, target.tokenizer, last=args.prompt_tokens)
    trials, base = measure_trials(target, model, prompts, args.new_tokens)
    for t in trials:
        print(f"{t.mode} gamma {t.gamma} total_tokens {t.total_tokens}: tau {t.tau:.3f}, speedup {t.speedup:.3f}, "
              f"identical {t.identical}")
    info = {"prompts": f"{args.prompts} x {len(prompts)}", "new_tokens": args.new_tokens, "threads": args.threads,
            "matmul": target.matmul}
    best = write_calibration(args.weights, trials, base, info)
    print(f"chosen: {best.mode}, gamma {best.gamma}, total_tokens {best.total_tokens} (speedup {best.speedup:.3f})")
    return best


if __name__ == "__main__":
    main()
