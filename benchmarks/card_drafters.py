"""The zoo card's section on the target's trained drafters, measured on held-out windows the card picks itself:
per-head top-1 / top-5 accuracy of the Medusa heads and top-1 agreement of the EAGLE drafter with the target.
A script beside the benchmarks (it reads two drafters' internals, which neither the zoo nor a drafter may do).

    python benchmarks/card_drafters.py --workdir work/zoo --target DIR --medusa DIR --eagle DIR [--out FILE]

Medusa head k at position t is scored against the token at t + 2 + k of the held-out text (as written) and of
the target's own greedy continuation of the window's first half (what decoding actually accepts). EAGLE is fed
the target's true features and scored on argmax agreement with the target's next-token choice.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from specfamily.train.tokens import fixed_windows


@dataclass
class DrafterCard:
    windows: int
    window_tokens: int
    medusa_top1: list[float]  # per head, on held-out text
    medusa_top5: list[float]
    medusa_greedy_top1: list[float]  # per head, on the target's greedy continuations
    medusa_greedy_top5: list[float]
    medusa_tree_nodes: int
    medusa_parameters: int
    eagle_top1_agreement: float
    eagle_parameters: int


@torch.no_grad()
def medusa_accuracies(target, heads, windows: torch.Tensor) -> dict[str, list[float]]:
    """Per-head top-1 and top-5 on the windows as written and on the target's greedy continuations."""
    from specfamily.drafters.medusa.calibrate import batched_features, head_accuracies
    from specfamily.train.tokens import greedy_windows

    half = windows.shape[1] // 2
    continued = greedy_windows(target.model, windows, half, target.eos_token_id or 0)
    out = {}
    for label, ids, start in (("", windows, 0), ("greedy_", continued, half - 1)):
        acc = head_accuracies(heads, batched_features(target.model, ids), ids, ranks=5, start=start)
        out[f"{label}top1"], out[f"{label}top5"] = acc[:, 0].tolist(), acc.sum(dim=1).tolist()
    return out


def measure(workdir: str, target_path: str, medusa: str, eagle: str, windows: int = 16,
            seq_len: int = 256) -> DrafterCard:
    from specfamily.core.target import load_target
    from specfamily.drafters.eagle.checkpoint import load_eagle
    from specfamily.drafters.eagle.objective import top1_agreement
    from specfamily.drafters.medusa.checkpoint import load_checkpoint

    target = load_target(target_path, dtype=torch.float32)
    rows = fixed_windows(np.load(Path(workdir) / "heldout.npy"), windows, seq_len - 1)  # (m, seq_len)
    heads, meta = load_checkpoint(medusa, target)
    acc = medusa_accuracies(target, heads, rows)
    eagle_model, _ = load_eagle(eagle, target.model)
    return DrafterCard(
        windows=rows.shape[0], window_tokens=rows.shape[1],
        medusa_top1=acc["top1"], medusa_top5=acc["top5"],
        medusa_greedy_top1=acc["greedy_top1"], medusa_greedy_top5=acc["greedy_top5"],
        medusa_tree_nodes=len(meta.tree or []), medusa_parameters=sum(p.numel() for p in heads.parameters()),
        eagle_top1_agreement=top1_agreement(eagle_model, target.model, rows),
        eagle_parameters=sum(p.numel() for p in eagle_model.parameters()),
    )


def markdown(card: DrafterCard) -> str:
    def cells(values: list[float]) -> str:
        return " | ".join(f"{v:.3f}" for v in values)

    k = len(card.medusa_top1)
    lines = [
        f"Measured on {card.windows} held-out windows of {card.window_tokens} tokens.",
        "",
        f"Medusa heads ({card.medusa_parameters:,} parameters, default tree of {card.medusa_tree_nodes} nodes); "
        "head k predicts the token at t + 2 + k:",
        "",
        "| accuracy | " + " | ".join(f"head {i}" for i in range(k)) + " |",
        "|---|" + "---:|" * k,
        f"| top-1, held-out text | {cells(card.medusa_top1)} |",
        f"| top-5, held-out text | {cells(card.medusa_top5)} |",
        f"| top-1, target's greedy text | {cells(card.medusa_greedy_top1)} |",
        f"| top-5, target's greedy text | {cells(card.medusa_greedy_top5)} |",
        "",
        f"EAGLE drafter ({card.eagle_parameters:,} parameters of its own; embedding and LM head are the target's): "
        f"top-1 agreement with the target {card.eagle_top1_agreement:.3f}, fed the target's features.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> DrafterCard:
    parser = argparse.ArgumentParser(prog="python benchmarks/card_drafters.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="holds heldout.npy")
    parser.add_argument("--target", default="zoo:code-target")
    parser.add_argument("--medusa", default="zoo:code-medusa")
    parser.add_argument("--eagle", default="zoo:code-eagle")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="", help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    card = measure(args.workdir, args.target, args.medusa, args.eagle, args.windows, args.seq_len)
    if args.out:
        from specfamily.io.files import write_text_atomically

        write_text_atomically(Path(args.out), json.dumps(asdict(card), indent=1) + "\n")
    print(markdown(card))
    return card


if __name__ == "__main__":
    main()
