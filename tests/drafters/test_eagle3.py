"""EAGLE-3 drafter: shapes, the draft vocabulary's d2t/t2d, greedy identity and losslessness."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.drafters.eagle.drafter import Eagle3Drafter
from specfamily.drafters.eagle.model3 import default_layers
from specfamily.drafters.shared.draft_vocab import DraftVocab, d2t_of, t2d_of, vocab_from_d2t
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, tiny_target

PRUNED = [0, 2, 3, 5, 6]


def test_registered_with_its_schema():
    assert "eagle3" in sf.list_drafters()
    drafter = sf.create_drafter("eagle3", tiny_target("llama"), weights="random", gamma=2)
    assert isinstance(drafter, Eagle3Drafter)


def test_shapes_follow_the_reference_layout():
    target = tiny_target("llama", layers=8, vocab_size=16)
    drafter = Eagle3Drafter(target, weights="random", draft_vocab=PRUNED)
    model, h = drafter.model, target.hidden_size
    assert drafter.needs_features == (2, 4, 5)  # (2, L // 2, L - 3)
    names = set(model.state_dict())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
            "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight"} <= names
    assert not any(name.startswith("embed_tokens") for name in names)  # the target's embedding is read
    assert model.fc.weight.shape == (h, 3 * h)
    assert model.midlayer.self_attn.q_proj.weight.shape[1] == 2 * h
    assert model.lm_head.weight.shape == (len(PRUNED), h)
    tokens, hidden = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 3 * h, dtype=target.dtype)
    out = model(tokens, model.fuse(hidden), torch.arange(3)[None])
    assert out.shape == (1, 3, h) and model.logits(out).shape == (1, 3, len(PRUNED))


def test_default_layers():
    assert default_layers(32) == (2, 16, 29)  # Llama-3.1-8B's, as EAGLE/vLLM/speculators choose
    assert default_layers(2) == (0, 1, 2)  # too shallow for the reference's: embeddings, middle, final


def test_d2t_and_t2d_map_draft_indices_to_target_ids():
    vocab = DraftVocab(torch.tensor([0, 2, 3, 5, 6]), 8)
    d2t, t2d = d2t_of(vocab), t2d_of(vocab)
    assert (torch.arange(5) + d2t).tolist() == [0, 2, 3, 5, 6]  # target_id = draft_id + d2t[draft_id]
    assert t2d.tolist() == [True, False, True, True, False, True, True, False]
    back, order = vocab_from_d2t(d2t, 8, t2d)
    assert torch.equal(back.ids, vocab.ids) and order.tolist() == [0, 1, 2, 3, 4]
    shuffled = torch.tensor([5, 0, 6]) - torch.arange(3)  # an unsorted reference map
    back, order = vocab_from_d2t(shuffled, 8)
    assert back.ids.tolist() == [0, 5, 6] and order.tolist() == [1, 0, 2]
    with pytest.raises(ValueError, match="t2d does not mark"):
        vocab_from_d2t(d2t, 8, torch.zeros(8, dtype=torch.bool))
    with pytest.raises(ValueError, match="same target id"):
        vocab_from_d2t(torch.tensor([1, 0]), 8)


def test_drafts_stay_in_the_draft_vocabulary_and_q_is_zero_outside():
    target = tiny_target("llama")
    drafter = Eagle3Drafter(target, weights="random", gamma=3, mode="chain", draft_vocab=PRUNED)
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda ctx, gamma: proposals.append(propose(ctx, gamma)) or proposals[-1]
    sf.generate(target, drafter, [1, 2, 3], max_new_tokens=12, sampling=sf.SamplingConfig(temperature=1.0))
    drafted = [draft for draft in proposals if len(draft)]
    assert drafted
    for draft in drafted:
        assert set(draft.tokens.tolist()) <= set(PRUNED)
        assert torch.allclose(draft.q.sum(-1), torch.ones(len(draft), dtype=draft.q.dtype))
        assert float(draft.q[:, [1, 4, 7]].abs().sum()) == 0.0


def test_bad_options_are_refused():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match=r"\[5\] outside \[0, 2\]"):
        Eagle3Drafter(target, weights="random", layers=[0, 1, 5])
    with pytest.raises(ValueError, match="mode"):
        Eagle3Drafter(target, weights="random", mode="forest")
    with pytest.raises(ValueError) as caught:
        Eagle3Drafter(target)  # a target the zoo has no eagle3 weights for
    assert str(caught.value) == (
        "there are no eagle3 weights for this target in the zoo: it is none of the zoo's targets (zoo:code-target, "
        "zoo:smollm2); pass weights= (a folder in ours/EAGLE/SpecForge/speculators layout, or 'random') to the "
        "eagle3 drafter, or train them with `python -m specfamily.drafters.eagle.train --variant eagle3 "
        "--target TARGET --dataset json --data-files CORPUS.jsonl --out DIR`")
    with pytest.raises(ValueError, match="applies to weights='random'"):
        Eagle3Drafter(target, weights="somewhere", draft_vocab=[1, 2])


@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_greedy_equals_transformers(mode):
    """Llama and GPT-2 targets (the draft layer is a Llama layer for both, as the reference's is)."""
    reports = assert_greedy_equivalent(lambda t: Eagle3Drafter(t, weights="random", gamma=3, mode=mode))
    assert all(report.drafted_passes > 0 for report in reports)


# Measured depth shares on the conformance target (150-request pilots; t1, t0.7 + top-p 0.9, top-k 5): chains reach
# depth 3 in 62%, 44%, 40% of requests and trees (top_k 4, 30 nodes) in 7%, 9%, 15% (depth 2: about 80%): a
# random drafter's top-ranked depth-2 nodes are rarely the target's. t1 chains are tested at depth 3; the rest at
# depth 2, where the shares give the kit its power (the registered-drafter matrix runs depth 3 for every config).
def test_lossless_chain_at_depth_3():
    assert_lossless(lambda t: Eagle3Drafter(t, weights="random", gamma=3, mode="chain"),
                    configs=[SAMPLING_MATRIX[0]], min_depth=3)


def test_lossless_tree_at_depth_2():
    assert_lossless(lambda t: Eagle3Drafter(t, weights="random", gamma=3, top_k=4, total_tokens=30),
                    configs=[SAMPLING_MATRIX[2]], min_depth=2)


def test_lossless_chain_with_a_draft_vocabulary():
    assert_lossless(lambda t: Eagle3Drafter(t, weights="random", gamma=3, mode="chain", draft_vocab=PRUNED),
                    configs=[SAMPLING_MATRIX[1]], min_depth=2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_lossless_every_config(mode):
    assert_lossless(lambda t: Eagle3Drafter(t, weights="random", gamma=3, mode=mode, top_k=4, total_tokens=30),
                    min_depth=2)


def test_without_weights_it_loads_the_zoo_eagle3_for_its_target(monkeypatch, tmp_path):
    import specfamily.zoo as zoo
    from specfamily.drafters.eagle.formats3 import save_eagle3

    target = tiny_target("llama")
    trained = Eagle3Drafter(target, weights="random", draft_vocab=PRUNED, seed=3).model
    monkeypatch.setattr(zoo.paths, "package_dir", lambda *parts: tmp_path.joinpath("zoo", *parts))
    monkeypatch.setattr(zoo, "identify", lambda target: "zoo:smollm2")  # as if given the fetched target
    save_eagle3(trained, tmp_path / "zoo" / "weights" / "smollm2-eagle3", target)
    for drafter in (Eagle3Drafter(target), Eagle3Drafter(target, weights="zoo:smollm2-eagle3")):
        assert drafter.model.vocab.ids.tolist() == PRUNED
        for name, tensor in trained.state_dict().items():
            assert torch.equal(drafter.model.state_dict()[name], tensor), name
