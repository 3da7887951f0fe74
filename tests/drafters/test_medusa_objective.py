"""The heads' training objectives (specfamily.drafters.medusa.objective): cross-entropy and teacher distillation."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from specfamily.drafters.medusa.calibrate import target_features
from specfamily.drafters.medusa.heads import build_heads, shape_for
from specfamily.drafters.medusa.hydra_heads import build_hydra, hydra_logits, hydra_loss, hydra_shape_for
from specfamily.drafters.medusa.hydra_train import HydraTraining
from specfamily.drafters.medusa.objective import (
    distill_loss,
    distill_objective,
    kl_to_logits,
    medusa_logits,
    medusa_loss,
    target_logits,
)
from specfamily.drafters.medusa.train import MedusaTraining
from specfamily.drafters.medusa.train_config import TrainConfig
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.recipes.distill import DistillConfig, write_batch
from specfamily.testing import tiny_target
from specfamily.train.ddp import Ranks
from specfamily.train.distilled import is_heldout
from specfamily.train.distributed import DistInfo
from specfamily.train.precision import Precision

V = 64


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=V, spread=1.0, dtype=torch.float32)


@pytest.fixture(scope="module")
def distilled_folder(tmp_path_factory, target):
    """One batch file of conversations (random prompts, the target's greedy answers, their features), some held out."""
    folder = tmp_path_factory.mktemp("distilled")
    turns = (f"user turn {i}" for i in range(100000))
    train = [t for t, _ in zip((t for t in turns if not is_heldout(t)), range(4), strict=False)]
    heldout = [t for t, _ in zip((t for t in turns if is_heldout(t)), range(2), strict=False)]
    gen, prompts, convs = torch.Generator().manual_seed(0), [], []
    for _ in train + heldout:
        prompt = torch.randint(0, V, (1, 6), generator=gen)
        with torch.no_grad():
            out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                        max_new_tokens=30, min_new_tokens=30, pad_token_id=0)
        prompts.append(prompt[0].tolist())
        convs.append((out[0].tolist(), target_features(target.model, out)[0, :-1]))
    write_batch(DistillConfig(out=str(folder)), 0, train + heldout, prompts, convs)
    return folder


def _perturb(heads, seed: int, scale: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return heads


def _batch(target, seed: int = 0, rows: int = 2, length: int = 12):
    ids = torch.randint(0, V, (rows, length), generator=torch.Generator().manual_seed(seed))
    return ids, target_features(target.model, ids)


def _one_hot_logits(ids: torch.Tensor, size: int) -> torch.Tensor:
    """(B, T, size) teacher logits whose row j is one-hot on ids[:, j + 1] (the last row: anything)."""
    labels = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)
    return torch.where(F.one_hot(labels, size).bool(), 0.0, -torch.inf)


def test_the_loss_is_zero_with_zero_gradient_where_a_head_equals_the_target():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(2, 10, 7, generator=gen) * 2
    heads = [teacher[:, 1 + k : 9].clone().requires_grad_() for k in range(3)]  # head k at t = target at t + 1 + k
    total, per_head = distill_loss(heads, teacher, decay=0.8)
    total.backward()
    assert total.item() == pytest.approx(0.0, abs=1e-6) and per_head == pytest.approx([0.0] * 3, abs=1e-6)
    assert all(h.grad.abs().max() < 1e-6 for h in heads)
    moved = [h.detach() + 0.5 * torch.randn(h.shape, generator=gen) for h in heads]
    assert all(loss > 1e-3 for loss in distill_loss(moved, teacher)[1])
    shifted = [teacher[:, k : 8 - 1].clone() for k in range(3)]  # one position off: not the target's distribution
    assert all(loss > 1e-2 for loss in distill_loss(shifted, teacher)[1])


def test_the_gradient_is_p_minus_q():
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(5, 9, generator=gen), dim=-1)
    z = torch.randn(5, 9, generator=gen, requires_grad=True)
    kl_to_logits(p, z).backward()
    assert torch.allclose(z.grad, (torch.softmax(z.detach(), -1) - p) / 5, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_a_one_hot_target_gives_the_heads_cross_entropy(target, temperature):
    """Medusa's and Hydra's CE equal distillation from a one-hot p on the same labels: also pins the alignment (head
    k at t against the target's row t + 1 + k)."""
    ids, features = _batch(target)
    teacher = _one_hot_logits(ids, V)
    medusa = _perturb(build_heads(target, shape_for(target, 3, 2)), seed=1)
    hydra = _perturb(build_hydra(target, hydra_shape_for(target, 3, 2)), seed=2)
    for heads, ce, logits in ((medusa, medusa_loss, medusa_logits), (hydra, hydra_loss, hydra_logits)):
        scaled = [z / temperature for z in logits(heads, features, ids)]  # tau**2 KL(one-hot || q / tau)
        got, got_heads = distill_loss(logits(heads, features, ids), teacher, 0.7, temperature)
        if temperature == 1.0:
            want, want_heads = ce(heads, features, ids, 0.7)
            want = want.detach()
        else:
            want_heads = [temperature**2 * F.cross_entropy(z.reshape(-1, V), ids[:, 2 + k :].reshape(-1)).item()
                          for k, z in enumerate(scaled)]
            want = sum(0.7**k * w for k, w in enumerate(want_heads))
        assert got_heads == pytest.approx(want_heads, rel=1e-5)
        assert float(got.detach()) == pytest.approx(float(want), rel=1e-5)


def test_over_a_draft_vocabulary_p_is_the_targets_restricted_and_renormalised(target):
    ids, features = _batch(target, seed=3)
    vocab = DraftVocab(torch.tensor([0, 3, 5, 8, 13, 21, 34, 55]), V)
    lm_head = target.model.get_output_embeddings()
    full = lm_head(features).detach()
    restricted = target_logits(lm_head, features, vocab)
    assert restricted.shape == (2, 12, 8) and torch.allclose(restricted, full[..., vocab.ids], atol=1e-5)
    p_full = torch.softmax(full, -1)[..., vocab.ids]
    assert torch.allclose(torch.softmax(restricted, -1), p_full / p_full.sum(-1, keepdim=True), atol=1e-6)
    heads = _perturb(build_hydra(target, hydra_shape_for(target, 2, 1, share_lm_head=True, draft_vocab=8), vocab), 4)
    logits = hydra_logits(heads, features, ids)
    assert logits[0].shape == (2, 10, 8)
    _, per_head = distill_objective(hydra_logits, lm_head)(heads, features, ids)
    for k, z in enumerate(logits):
        p = (p_full / p_full.sum(-1, keepdim=True))[:, 1 + k : 1 + k + z.shape[1]]
        want = (p * (p.log() - torch.log_softmax(z, -1))).sum(-1).mean()
        assert per_head[k] == pytest.approx(want.item(), rel=1e-5)


def _trainee(training, target):
    training.target = target
    return training.build(Ranks(DistInfo()), Precision.of("cpu", "float32"))


@pytest.mark.parametrize("family", [MedusaTraining, HydraTraining])
def test_the_trainers_objective_option_reaches_the_loss(target, tmp_path, family, distilled_folder):
    cfg = TrainConfig(target="tiny", distilled=str(distilled_folder), out=str(tmp_path / "run"), num_heads=3, layers=2,
                      batch=2, seq_len=16, eval_windows=2, eval_prompts=1, ranks=4, max_nodes=4)
    ids, features = _batch(target, seed=5, length=16)
    ce, distill = _trainee(family(cfg), target), _trainee(family(replace(cfg, objective="distill")), target)
    distill.model.load_state_dict(ce.model.state_dict())
    logits_of = family.logits
    teacher = target.model.get_output_embeddings()(features).detach()
    with torch.no_grad():
        want, want_heads = distill_loss(logits_of(ce.model, features, ids), teacher, cfg.decay)
    got, got_heads = distill.objective(ids, features)
    assert got_heads == pytest.approx(want_heads, rel=1e-5)
    assert float(got.detach()) == pytest.approx(float(want), rel=1e-5)
    assert ce.objective(ids, features)[1] == pytest.approx(family.loss(ce.model, features, ids, cfg.decay)[1])
    # one optimizer step on each objective: distillation moves the heads towards the target's distributions
    for trainee in (ce, distill):
        trainee.optimizer.zero_grad()
        trainee.objective(ids, features)[0].backward()
        trainee.optimizer.step()
    with torch.no_grad():
        after_distill = distill_loss(logits_of(distill.model, features, ids), teacher, cfg.decay)[0]
        after_ce = distill_loss(logits_of(ce.model, features, ids), teacher, cfg.decay)[0]
    assert float(after_distill) < float(want) and float(after_distill) < float(after_ce)


def test_bad_objective_options_are_refused():
    with pytest.raises(ValueError, match="objective must be 'ce' or 'distill', got 'kl'"):
        TrainConfig(objective="kl")
    with pytest.raises(ValueError, match="distill_temperature must be > 0, got 0.0"):
        TrainConfig(objective="distill", distill_temperature=0.0)
    assert TrainConfig().objective == "ce" and TrainConfig().distill_temperature == 1.0
