"""Medusa heads over a reduced draft vocabulary (FR-Spec): shapes, id maps, drafting, checkpoints, calibration, loss."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import specfamily as sf
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.medusa.calibrate import head_accuracies, head_hits, rank_table, target_features
from specfamily.drafters.medusa.checkpoint import MedusaCheckpoint, load_checkpoint, read_checkpoint, save_checkpoint
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.heads import IGNORE_INDEX, HeadsShape, MedusaHeads, build_heads, shape_for
from specfamily.drafters.medusa.objective import medusa_loss
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.io.identity import target_identity
from specfamily.testing import assert_greedy_equivalent, tiny_target

V = 64


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=V, spread=1.0)


def _vocab(vocab_size: int = V, step: int = 3) -> DraftVocab:
    return DraftVocab(torch.arange(0, vocab_size, step), vocab_size)


def _heads(target, vocab: DraftVocab | None, num_heads: int = 3, seed: int = 0, scale: float = 0.3,
           **shape) -> MedusaHeads:
    size = vocab.size if vocab is not None else 0
    heads = build_heads(target, shape_for(target, num_heads, draft_vocab=size, **shape), vocab)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return heads


@pytest.mark.parametrize("share_lm_head", [False, True])
def test_logits_over_the_draft_vocabulary_and_the_id_maps(target, share_lm_head):
    vocab = _vocab()
    heads = build_heads(target, shape_for(target, 3, share_lm_head=share_lm_head, draft_vocab=vocab.size), vocab)
    n = vocab.size
    features = torch.randn(2, 5, target.hidden_size, dtype=torch.float64)
    logits = heads(features)
    assert logits.shape == (3, 2, 5, n) and heads(features[0, 0]).shape == (3, n)
    full = target.model.get_output_embeddings()(features)
    for k in range(3):  # fresh heads: the target head's rows for the draft ids
        torch.testing.assert_close(logits[k], full[..., vocab.ids])
    index = torch.tensor([[0, 1], [n - 1, 5]])
    assert torch.equal(heads.token_ids(index), vocab.ids[index])
    tokens = torch.tensor([0, 1, 3, V - 1, 30, 31])
    assert heads.draft_index(tokens).tolist() == [0, IGNORE_INDEX, 1, 21, 10, IGNORE_INDEX]
    assert heads.draft_ids.dtype == torch.int64 and "draft_ids" in heads.state_dict()
    if share_lm_head:  # one frozen subset of the target head: neither trained nor saved
        assert all(h.proj is None for h in heads.heads) and heads.lm_head.weight.shape == (n, target.hidden_size)
        assert not any("proj" in k or "subset" in k for k in heads.state_dict())
        assert all(p.shape != (n, target.hidden_size) for p in heads.parameters())
    else:
        assert all(h.proj.weight.shape == (n, target.hidden_size) for h in heads.heads)
    plain = build_heads(target, shape_for(target, 2))
    assert plain.vocab is None and "draft_ids" not in plain.state_dict()
    assert torch.equal(plain.token_ids(index), index) and torch.equal(plain.draft_index(tokens), tokens)


def test_shape_and_vocabulary_checks(target):
    with pytest.raises(ValueError, match=r"draft_vocab must be an integer in 0..8"):
        HeadsShape(1, 4, 8, draft_vocab=9)
    with pytest.raises(ValueError, match="need their draft vocabulary"):
        MedusaHeads(HeadsShape(1, 4, 8, draft_vocab=2))
    with pytest.raises(ValueError, match="does not fit heads of shape draft_vocab=3"):
        build_heads(target, shape_for(target, 1, draft_vocab=3), _vocab())
    with pytest.raises(ValueError, match="for heads of shape draft_vocab=0"):
        build_heads(target, shape_for(target, 1), _vocab())


def test_drafter_proposes_target_ids_inside_the_vocabulary(target):
    vocab = _vocab()
    drafter = MedusaDrafter.from_heads(target, _heads(target, vocab, num_heads=4))
    ctx = sf.DecodeContext(target, torch.tensor([3, 1, 4]), sf.SamplingConfig(), torch.Generator())
    drafter.begin(ctx)
    features = torch.randn(2, target.hidden_size, dtype=torch.float64)
    drafter.observe(VerifyOutcome([7, 8], [0], 4, features, 4))
    draft = drafter.propose(ctx, 4)
    assert len(draft) == drafter.tree.size and set(draft.tokens.tolist()) <= set(vocab.ids.tolist())
    top = drafter.heads(features[-1]).topk(drafter.tree.top_k, dim=-1).indices
    expected = [int(vocab.ids[top[d - 1, r]]) for d, r in zip(drafter.tree.depths.tolist(),
                                                               drafter.tree.ranks.tolist(), strict=True)]
    assert draft.tokens.tolist() == expected
    with pytest.raises(ValueError, match="tree uses rank 22, outside the vocabulary of 22 tokens"):
        MedusaDrafter.from_heads(target, drafter.heads, tree=[(22,)])


def test_greedy_with_draft_vocabulary_heads_equals_plain_decoding():
    def factory(target):
        vocab = DraftVocab(torch.arange(1, target.vocab_size, 2), target.vocab_size)  # odd ids only
        return MedusaDrafter.from_heads(target, _heads(target, vocab, num_heads=4, scale=0.1))

    reports = assert_greedy_equivalent(factory)
    assert all(report.proposed_tokens > 0 for report in reports)


def test_checkpoint_round_trip_keeps_the_ids(tmp_path, target):
    vocab = _vocab()
    heads = _heads(target, vocab, layers=2)
    meta = MedusaCheckpoint(heads.shape, target_identity(target.model), [[0], [1], [0, 0]])
    folder = save_checkpoint(tmp_path / "fp16", heads, meta, dtype=torch.float16)
    saved = load_file(str(folder / "model.safetensors"))
    assert saved["draft_ids"].dtype == torch.int64 and torch.equal(saved["draft_ids"], vocab.ids)
    assert all(v.dtype == torch.float16 for k, v in saved.items() if k != "draft_ids")
    assert json.loads((folder / "config.json").read_text())["shape"]["draft_vocab"] == vocab.size
    loaded, loaded_meta = load_checkpoint(folder, target)
    assert loaded_meta.shape == heads.shape and torch.equal(loaded.vocab.ids, vocab.ids)
    assert loaded.draft_ids.dtype == torch.int64
    exact, _ = load_checkpoint(save_checkpoint(tmp_path / "fp32", heads, meta), target)
    features = torch.randn(4, target.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(exact(features), heads(features), rtol=0, atol=0)
    drafter = sf.create_drafter("medusa", target, weights=str(tmp_path / "fp32"))
    assert torch.equal(drafter.heads.vocab.ids, vocab.ids)
    prompt = [5, 9, 2, 7]
    assert sf.generate(target, drafter, prompt, max_new_tokens=20).tokens == \
        sf.generate(target, None, prompt, max_new_tokens=20).tokens
    plain = build_heads(target, shape_for(target, 2))  # full-vocabulary checkpoints read as before
    folder = save_checkpoint(tmp_path / "plain", plain, MedusaCheckpoint(plain.shape, target_identity(target.model)))
    assert "draft_vocab" not in json.loads((folder / "config.json").read_text())["shape"]
    assert read_checkpoint(folder).shape.draft_vocab == 0 and load_checkpoint(folder, target)[0].vocab is None


def test_checkpoint_without_its_ids_is_refused(tmp_path, target):
    heads = _heads(target, _vocab())
    folder = save_checkpoint(tmp_path / "h", heads, MedusaCheckpoint(heads.shape, target_identity(target.model)))
    config = json.loads((folder / "config.json").read_text())
    config["shape"].pop("draft_vocab")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"does not match its config: missing \[.*\], unexpected \['draft_ids'\]"):
        load_checkpoint(folder, target)


def test_calibration_counts_tokens_outside_the_vocabulary_as_misses(target):
    ids = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))
    features = target_features(target.model, ids)
    # every id in the vocabulary, same weights: exactly the full-vocabulary heads' statistics
    full = _heads(target, None)
    every = build_heads(target, shape_for(target, 3, draft_vocab=V), DraftVocab(torch.arange(V), V))
    every.load_state_dict({**full.state_dict(), "draft_ids": torch.arange(V)})
    for x, y in zip(head_hits(full, features, ids, 4), head_hits(every, features, ids, 4), strict=True):
        assert torch.equal(x, y)
    assert torch.equal(rank_table(full, features, ids, 4), rank_table(every, features, ids, 4))
    # labels all outside the vocabulary: no hit at any rank, every rank "not in the top"
    odd = ids | 1
    heads = _heads(target, _vocab(step=2))  # even ids
    hits, counts = head_hits(heads, features, odd, 4)
    assert hits.sum() == 0 and counts.tolist() == [3 * 8, 3 * 7, 3 * 6]
    assert (rank_table(heads, features, odd, 4) == 4).all()
    assert head_accuracies(heads, features, odd, 4).sum() == 0
    # mixed: hits are those of the mapped top-k
    hits, _ = head_hits(heads, features, ids, 4)
    for k in range(3):
        top = heads.token_ids(heads.heads[k](features[:, : 8 - k]).topk(4, dim=-1).indices)
        assert hits[k].tolist() == [int((top[..., r] == ids[:, 2 + k :]).sum()) for r in range(4)]


def test_loss_ignores_labels_outside_the_vocabulary(target):
    vocab = _vocab(step=2)  # even ids
    heads = _heads(target, vocab, num_heads=2)
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    features = target_features(target.model, ids)
    loss, per_head = medusa_loss(heads, features, ids, decay=0.5)
    expected = 0.0
    for k in range(2):
        terms = [F.cross_entropy(heads.heads[k](features[b, t]).view(1, -1), (ids[b, t + 2 + k] // 2).view(1))
                 for b in range(2) for t in range(9 - 2 - k) if ids[b, t + 2 + k] % 2 == 0]
        assert 0 < len(terms) < 2 * (9 - 2 - k)  # some labels inside, some outside
        assert per_head[k] == pytest.approx(float(torch.stack(terms).mean().detach()))
        expected = expected + 0.5**k * torch.stack(terms).mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    outside, per_head = medusa_loss(heads, features, ids | 1)  # nothing to learn, and no NaN
    assert float(outside.detach()) == 0.0 and per_head == [0.0, 0.0]
