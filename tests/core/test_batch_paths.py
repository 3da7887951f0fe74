"""The features a batched pass hands each slot's drafter (``batch_loop._Batch._commit``): the rows of its committed
path, right, each a copy of its own."""

import torch

import specfamily as sf
from specfamily.core.types import Draft
from specfamily.testing import OracleDrafter, tiny_target


def test_each_slot_observes_a_copy_of_its_committed_path_usable_outside_inference_mode():
    """Every other pass drafts (the oracle's chain, all accepted), the ones between draft nothing in every slot. Each
    slot's rows predict its committed tokens through the LM head, called outside inference mode (the feature at t
    predicts t + 1: what a drafter learning online from them does), and are a tensor of their own, exactly their
    size, on both kinds of pass: a view of the pass's features would keep its draft rows alive, and the forward's own
    rows are inference tensors, which autograd refuses (views of one copy of the pass cost as much as a copy a slot:
    session 34)."""
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    passes = []

    class Alternating(OracleDrafter):
        needs_features = True

        def propose(self, ctx, gamma):
            return Draft.empty() if len(passes) % 2 else super().propose(ctx, gamma)

        def observe_batch(self, drafters, outcomes):
            passes.append(list(outcomes))
            super().observe_batch(drafters, outcomes)

    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    results = sf.generate_batch(target, Alternating(target, gamma=2), prompts, max_new_tokens=12)
    assert [r.tokens for r in results] == [r.tokens for r in sf.generate_batch(target, None, prompts, 12)]
    lm_head = target.model.get_output_embeddings()
    undrafted = drafted = 0
    for outcomes in passes[1:]:  # after the prefill pass
        for outcome in outcomes:
            predicted = lm_head(outcome.features).argmax(-1).tolist()
            assert predicted[-len(outcome.tokens):] == outcome.tokens
            assert not outcome.features.is_inference()
            assert outcome.features.untyped_storage().nbytes() == outcome.features.nbytes
        assert len({o.features.untyped_storage().data_ptr() for o in outcomes}) == len(outcomes)
        undrafted += all(o.draft_size == 0 for o in outcomes)
        drafted += any(o.draft_size > 0 for o in outcomes)
    assert undrafted >= 2 and drafted >= 2  # both kinds of pass were reached
