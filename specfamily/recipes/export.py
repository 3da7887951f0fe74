"""``specfamily-zoo export``: a drafter trained here, written in the layout a serving engine or reference loads:
eagle3 -> ``speculators`` (vLLM) or ``eagle`` (EAGLE / SpecForge, SGLang); eagle -> ``eagle`` (EAGLE-1/2, heads in
the reference form only); medusa -> ``medusa`` (``medusa_lm_head.pt`` + config).

The source is any folder the drafter loads, checked against the target. The output is written atomically; an
existing non-empty folder is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

LAYOUTS = {"eagle3": ("speculators", "eagle"), "eagle": ("eagle",), "medusa": ("medusa",)}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ExportRequest:
    """What to export: ``drafter``'s weights at ``weights`` for ``target`` into ``out`` in ``layout``."""

    drafter: str
    weights: str
    target: str
    out: str
    layout: str | None = None  # the drafter's first layout when None
    dtype: str | None = None  # keep the weights' dtype when None
    base_model: str | None = None  # the target's name to record: Medusa's base_model_name_or_path, speculators'
    # verifier name_or_path (default: the target's own name or path)
    embedding: bool = True  # eagle3: carry a copy of the target's embedding (the references' loaders need it)

    def checked(self) -> ExportRequest:
        """This request with its layout filled in; a ValueError naming the bad field otherwise."""
        if self.drafter not in LAYOUTS:
            raise ValueError(f"export covers drafters {sorted(LAYOUTS)}, not {self.drafter!r}")
        layout = self.layout or LAYOUTS[self.drafter][0]
        if layout not in LAYOUTS[self.drafter]:
            raise ValueError(f"{self.drafter} exports to layouts {list(LAYOUTS[self.drafter])}, not {layout!r}")
        if not self.embedding and self.drafter != "eagle3":
            raise ValueError(f"--without-embedding applies to eagle3 exports, not {self.drafter}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        out = Path(self.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise FileExistsError(f"{str(out)!r} already exists and is not an empty folder; export writes a new one")
        return ExportRequest(self.drafter, self.weights, self.target, self.out, layout, self.dtype, self.base_model,
                             self.embedding)


def export(request: ExportRequest, target=None) -> Path:
    """Write the drafter of ``request`` in its layout and return the folder. ``target``: a loaded Target (else
    ``request.target`` is loaded)."""
    request = request.checked()
    if target is None:
        from specfamily.core.target import load_target

        target = load_target(request.target)
    dtype = DTYPES[request.dtype] if request.dtype else None
    out = Path(request.out)
    if out.is_dir():
        out.rmdir()  # empty (checked): the atomic writer renames a fresh folder into its place
    if request.drafter == "eagle3":
        from specfamily.drafters.eagle.formats3 import load_eagle3, save_eagle3

        return save_eagle3(load_eagle3(request.weights, target), out, target, request.layout, dtype, request.base_model,
                           request.embedding)
    if request.drafter == "eagle":
        from specfamily.drafters.eagle.checkpoint import load_eagle
        from specfamily.drafters.eagle.formats import save_eagle_repo

        return save_eagle_repo(load_eagle(request.weights, target.model)[0], out, target.model, dtype)
    from specfamily.drafters.medusa.checkpoint import load_checkpoint
    from specfamily.drafters.medusa.formats import save_medusa_repo

    return save_medusa_repo(load_checkpoint(request.weights, target)[0], out, target, dtype, request.base_model)
