"""The EAGLE training objective and its evaluations, on features the frozen target computes on the fly.

The drafter reads (f[t] + noise, x[t + 1]), f the target's final-norm features, and predicts f[t + 1]: loss =
w_reg * SmoothL1(f_hat, f[t + 1]) + w_cls * cross-entropy of the LM head over f_hat against p(x[t + 2]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specfamily.core.target import Target
from specfamily.core.tree_mask import additive
from specfamily.drafters.eagle.model import EagleModel
from specfamily.drafters.shared.greedy_tau import greedy_tau


@dataclass
class LossParts:
    loss: torch.Tensor  # scalar, differentiable
    regression: float
    classification: float


@torch.no_grad()
def target_features(target_model: PreTrainedModel, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, H) features after the final norm and (B, T, V) logits of the frozen target."""
    out = target_model(input_ids=windows.to(target_model.device), output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits


def causal_mask(model: EagleModel, length: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """None under sdpa (its causal kernel), an explicit additive causal mask (1, 1, T, T) otherwise."""
    if getattr(model.layer_config, "_attn_implementation", None) == "sdpa":
        return None
    visible = torch.ones(length, length, dtype=torch.bool, device=device).tril_()
    return additive(visible, dtype)[None, None]


def drafter_pass(model: EagleModel, windows: torch.Tensor, features: torch.Tensor, noise: torch.Tensor | None):
    """(B, T - 1, H) predictions of f[t + 1] from (f[t] (+ noise), x[t + 1]) for t = 0 .. T - 2."""
    b, length = windows.shape
    windows = windows.to(features.device)
    inputs = features[:, :-1] if noise is None else features[:, :-1] + noise
    positions = torch.arange(length - 1, device=features.device).expand(b, -1)
    mask = causal_mask(model, length - 1, features.dtype, features.device)
    return model(windows[:, 1:], inputs, positions, mask, None)


def eagle_loss(
    model: EagleModel, target_model: PreTrainedModel, windows: torch.Tensor, generator: torch.Generator,
    noise: float = 0.2, w_reg: float = 1.0, w_cls: float = 0.1,
) -> LossParts:
    """Feature regression plus soft-label cross-entropy, with uniform noise of width ``noise`` on input features."""
    features, _ = target_features(target_model, windows)
    return feature_loss(model, windows, features, generator, noise, w_reg, w_cls)


def feature_loss(
    model: EagleModel, windows: torch.Tensor, features: torch.Tensor, generator: torch.Generator,
    noise: float = 0.2, w_reg: float = 1.0, w_cls: float = 0.1,
) -> LossParts:
    """:func:`eagle_loss` on given target features (B, T, H) of ``windows`` (computed on the fly or stored).

    The soft labels are the target's distribution read through the drafter's head from the true next feature: the
    target's own logits for a full head, the target's distribution renormalised over the draft vocabulary for a
    reduced one (what the drafter can propose).
    """
    jitter = None
    if noise > 0:
        # drawn with the (CPU) data generator, then moved: the run stays reproducible on any device
        jitter = ((torch.rand(features[:, :-1].shape, generator=generator) - 0.5) * noise).to(features.device)
    predicted = drafter_pass(model, windows, features, jitter.to(features.dtype) if jitter is not None else None)
    regression = F.smooth_l1_loss(predicted, features[:, 1:])
    log_q = F.log_softmax(model.logits(predicted).float(), dim=-1)  # (B, T - 1, V or N)
    with torch.no_grad():
        p = F.softmax(model.logits(features[:, 1:]).float(), dim=-1)
    classification = -(p * log_q).sum(-1).mean()
    loss = w_reg * regression + w_cls * classification
    return LossParts(loss, float(regression.detach()), float(classification.detach()))


@torch.no_grad()
def top1_agreement(model: EagleModel, target_model: PreTrainedModel, windows: torch.Tensor, batch: int = 8) -> float:
    """Share of positions where the drafter's argmax equals the target's, fed the target's true features."""
    hits, total = 0, 0
    for chunk in windows.split(batch):
        features, logits = target_features(target_model, chunk)
        predicted = drafter_pass(model, chunk, features, None)
        hits += int((model.token_ids(model.logits(predicted).argmax(-1)) == logits[:, 1:].argmax(-1)).sum().item())
        total += predicted.shape[0] * predicted.shape[1]
    return hits / max(total, 1)


def measure_tau(target: Target, model: EagleModel, prompts: Sequence[torch.Tensor], new_tokens: int,
                **options) -> float:
    """Greedy tau (new tokens / target passes) of the drafter through the shared verifier, over all prompts, at a
    constant draft length (the cost-aware default would make tau depend on the machine's timings)."""
    from specfamily.drafters.eagle.drafter import EagleDrafter

    drafter = EagleDrafter(target, weights=model, **{"policy": "constant", **options})
    return greedy_tau(target, drafter, prompts, new_tokens)


@torch.no_grad()
def feature_agreement(model: EagleModel, windows: torch.Tensor, features: torch.Tensor, batch: int = 8) -> float:
    """:func:`top1_agreement` on stored features: the target's argmax is its full LM head over the next feature."""
    hits, total = 0, 0
    for tokens, feats in zip(windows.split(batch), features.split(batch), strict=True):
        predicted = drafter_pass(model, tokens, feats, None)
        target_top1 = model.parts.lm_head(feats[:, 1:]).argmax(-1)
        hits += int((model.token_ids(model.logits(predicted).argmax(-1)) == target_top1).sum().item())
        total += predicted.shape[0] * predicted.shape[1]
    return hits / max(total, 1)
