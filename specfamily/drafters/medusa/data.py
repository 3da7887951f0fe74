"""Self-distillation data for Medusa heads: windows whose tail is the target's own greedy continuation
(token streams and windows come from ``specfamily.tokens``)."""

from __future__ import annotations

import torch


def greedy_windows(model, windows: torch.Tensor, prompt_len: int, pad_token_id: int = 0) -> torch.Tensor:
    """Self-distillation: keep each window's first ``prompt_len`` tokens, replace the rest by the target's greedy
    continuation, so the heads learn what the target itself will produce. windows (B, T) -> (B, T)."""
    b, t = windows.shape
    if not 0 < prompt_len < t:
        raise ValueError(f"distillation prompt length must be in (0, {t}), got {prompt_len}")
    prefix = windows[:, :prompt_len].to(model.device)
    with torch.no_grad():
        out = model.generate(prefix, attention_mask=torch.ones_like(prefix), do_sample=False,
                             max_new_tokens=t - prompt_len, min_new_tokens=t - prompt_len, pad_token_id=pad_token_id)
    return out[:, :t]
