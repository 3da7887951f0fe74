"""Export the final heads of a resumable Hydra training run (its ``state.pt``) as a checkpoint folder.

The trainer exports only the heads with the best held-out tau; to measure the last step's heads too, this writes
them with the best checkpoint's metadata (shape, target identity, calibrated tree) and the state's step:

    python benchmarks/hydra_export_final.py work/smollm2-hydra/state.pt specfamily/zoo/weights/smollm2-hydra \
        work/smollm2-hydra-1108
"""

from __future__ import annotations

import argparse
from dataclasses import replace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("state", help="the training run's state.pt")
    parser.add_argument("best", help="the run's exported checkpoint folder (its metadata is reused)")
    parser.add_argument("out", help="the folder to write")
    parser.add_argument("--target", default="zoo:smollm2")
    args = parser.parse_args(argv)
    import torch

    import specfamily as sf
    from specfamily.drafters.medusa.checkpoint import load_checkpoint, save_checkpoint
    from specfamily.drafters.medusa.hydra_checkpoint import HYDRA

    target = sf.load_target(args.target)
    heads, meta = load_checkpoint(args.best, target, HYDRA)
    saved = torch.load(args.state, map_location="cpu", weights_only=False)
    heads.load_state_dict(saved["heads"])
    step = saved["state"]["step"]
    meta = replace(meta, training={**meta.training, "step": step, "exported": "final step"})
    save_checkpoint(args.out, heads, meta, torch.float16, HYDRA)
    print(f"exported the heads of step {step} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
