"""One training step of the slim Hydra heads against Medusa's, at the zoo:smollm2 recipe's shape: CPU time (process
time, one thread) of the loss's forward and backward, the arms interleaved. Shapes: H 576, V 49152, 4 heads of 2
blocks over a shared 16,384-row head, r 256, a batch of 8 x 128 tokens with random features (the cost does not
depend on the values). Prints each arm's parameters and times, and hydra/medusa.

    python benchmarks/hydra_step_cost.py --threads 1 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import torch
    from torch import nn

    from specfamily.drafters.medusa.heads import HeadsShape, MedusaHeads
    from specfamily.drafters.medusa.hydra_heads import HydraHeads, HydraShape, hydra_loss
    from specfamily.drafters.medusa.objective import medusa_loss
    from specfamily.drafters.shared.draft_vocab import DraftVocab

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h, v, n = 576, 49152, 16384
    embed, lm_head = nn.Embedding(v, h), nn.Linear(h, v, bias=False)
    vocab = DraftVocab(torch.arange(0, v, 3)[:n].contiguous(), v)
    heads = {"medusa": MedusaHeads(HeadsShape(4, h, v, 2, True, n), lm_head, vocab),
             "hydra": HydraHeads(HydraShape(4, h, v, 2, True, n, 256), embed, lm_head, vocab)}
    losses = {"medusa": medusa_loss, "hydra": hydra_loss}
    features, ids = torch.randn(8, 128, h), torch.randint(0, v, (8, 128))
    times: dict[str, list[float]] = {name: [] for name in heads}
    for _ in range(args.rounds):
        for name, module in heads.items():
            started = time.process_time()
            losses[name](module, features, ids)[0].backward()
            times[name].append(time.process_time() - started)
    for name, module in heads.items():
        print(f"{name}: {sum(p.numel() for p in module.parameters()):,} parameters, step CPU s "
              f"{[round(t, 2) for t in times[name]]}, median {statistics.median(times[name]):.2f}")
    print(f"hydra/medusa {statistics.median(times['hydra']) / statistics.median(times['medusa']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
