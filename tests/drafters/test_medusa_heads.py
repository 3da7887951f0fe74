import pytest
import torch
import torch.nn.functional as F

from specfamily.drafters.medusa.calibrate import head_accuracies, head_hits, rank_table, target_features
from specfamily.drafters.medusa.heads import HeadsShape, MedusaHeads, build_heads, shape_for
from specfamily.drafters.medusa.objective import medusa_loss, shifted
from specfamily.testing import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=32, spread=1.0)


def _perturb(heads: MedusaHeads, seed: int = 0) -> MedusaHeads:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return heads


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_shapes_and_fresh_heads_equal_the_lm_head(family):
    target = tiny_target(family, vocab_size=32, spread=1.0)
    heads = build_heads(target, shape_for(target, num_heads=3))
    lm_head = target.model.get_output_embeddings()
    features = torch.randn(2, 5, target.hidden_size, dtype=torch.float64)
    logits = heads(features)
    assert logits.shape == (3, 2, 5, 32)
    assert heads(features[0, 0]).shape == (3, 32)
    assert heads(features, num_heads=2).shape == (2, 2, 5, 32)
    for k in range(3):  # zero-initialised residual blocks: each head starts as the target's LM head
        torch.testing.assert_close(logits[k], lm_head(features))


def test_each_head_is_a_separate_module(target):
    heads = build_heads(target, shape_for(target, num_heads=4))
    blocks = {id(h.blocks[0].linear.weight) for h in heads.heads}
    projections = {id(h.proj.weight) for h in heads.heads}
    assert len(blocks) == 4 and len(projections) == 4
    with torch.no_grad():
        heads.heads[1].proj.weight.add_(1.0)
        heads.heads[1].blocks[0].linear.bias.add_(1.0)
    features = torch.randn(target.hidden_size, dtype=torch.float64)
    out = heads(features)
    torch.testing.assert_close(out[0], out[2])
    assert not torch.allclose(out[0], out[1])
    lm_weight = target.model.get_output_embeddings().weight
    assert heads.heads[1].proj.weight.data_ptr() != lm_weight.data_ptr()
    assert torch.equal(heads.heads[0].proj.weight, lm_weight)


def test_shared_lm_head_is_neither_trained_nor_saved(target):
    heads = build_heads(target, shape_for(target, num_heads=2, share_lm_head=True))
    assert all(h.proj is None for h in heads.heads)
    assert not any("proj" in key for key in heads.state_dict())
    lm_weight = target.model.get_output_embeddings().weight
    assert all(p.data_ptr() != lm_weight.data_ptr() for p in heads.parameters())
    features = torch.randn(target.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(heads(features)[1], target.model.get_output_embeddings()(features))


def test_layers_option_stacks_residual_blocks(target):
    heads = build_heads(target, shape_for(target, num_heads=2, layers=3))
    assert all(len(h.blocks) == 3 for h in heads.heads)


def test_heads_shape_checks():
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1, got 0"):
        HeadsShape(0, 8, 8)
    with pytest.raises(ValueError, match="share_lm_head=True needs the target's LM head"):
        MedusaHeads(HeadsShape(1, 8, 8, share_lm_head=True))


def test_labels_are_shifted_by_two_plus_k():
    ids = torch.arange(10).view(1, 10)
    features = torch.arange(10, dtype=torch.float64).view(1, 10, 1)
    for k in range(3):
        x, labels = shifted(features, ids, k)
        assert x[0, :, 0].tolist() == list(range(8 - k))
        assert labels[0].tolist() == list(range(2 + k, 10))  # position t -> token at t + 2 + k


def test_loss_is_the_decayed_sum_of_per_position_cross_entropies(target):
    heads = _perturb(build_heads(target, shape_for(target, num_heads=3)))
    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    features = target_features(target.model, ids)
    loss, per_head = medusa_loss(heads, features, ids, decay=0.5)
    expected, manual_heads = 0.0, []
    for k in range(3):
        terms = [
            F.cross_entropy(heads.heads[k](features[b, t]).view(1, -1), ids[b, t + 2 + k].view(1))
            for b in range(2) for t in range(9 - 2 - k)
        ]
        manual_heads.append(torch.stack(terms).mean())
        expected = expected + 0.5**k * manual_heads[-1]
    torch.testing.assert_close(loss, expected)
    assert per_head == pytest.approx([float(m.detach()) for m in manual_heads])
    loss.backward()
    assert all(p.grad is not None for p in heads.parameters())


def test_features_are_what_the_lm_head_reads(target):
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    features = target_features(target.model, ids)
    logits = target.model(input_ids=ids).logits
    torch.testing.assert_close(target.model.get_output_embeddings()(features), logits)


def test_head_hits_count_rank_matches_against_shifted_labels(target):
    heads = _perturb(build_heads(target, shape_for(target, num_heads=2)))
    ids = torch.randint(0, 32, (2, 7), generator=torch.Generator().manual_seed(1))
    features = target_features(target.model, ids)
    hits, counts = head_hits(heads, features, ids, ranks=3)
    assert counts.tolist() == [2 * 5, 2 * 4]
    for k in range(2):
        top = heads.heads[k](features[:, : 5 - k]).topk(3, dim=-1).indices
        for r in range(3):
            assert hits[k, r] == int((top[..., r] == ids[:, 2 + k :]).sum())
    late, late_counts = head_hits(heads, features, ids, ranks=3, start=2)  # positions t >= 2 only
    assert late_counts.tolist() == [2 * 3, 2 * 2]
    top = heads.heads[1](features[:, 2:4]).topk(3, dim=-1).indices
    assert late[1].tolist() == [int((top[..., r] == ids[:, 5:]).sum()) for r in range(3)]
    acc = head_accuracies(heads, features, ids, ranks=3, start=2, batch=1)
    torch.testing.assert_close(acc, late.double() / late_counts.double()[:, None])


def test_rank_table_gives_each_heads_rank_of_the_right_token(target):
    heads = _perturb(build_heads(target, shape_for(target, num_heads=2)))
    ids = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(2))
    features = target_features(target.model, ids)
    table = rank_table(heads, features, ids, ranks=4, start=1, batch=2)
    assert table.shape == (3 * 4, 2)  # positions 1 .. 4 have labels t + 2 and t + 3 inside the 8-token windows
    for b in range(3):
        for i, t in enumerate(range(1, 5)):
            for k in range(2):
                top = heads.heads[k](features[b, t]).topk(4).indices.tolist()
                label = int(ids[b, t + 2 + k])
                assert table[b * 4 + i, k] == (top.index(label) if label in top else 4)
