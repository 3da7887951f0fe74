"""Layer features: ``Target.forward(features=(i, j, k))`` and a drafter whose ``needs_features`` names layers."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.types import Draft
from specfamily.testing import tiny_target


def reference_states(target, ids: list[int]) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return tuple(h[0] for h in out.hidden_states)


@pytest.mark.parametrize("lean", [True, False])
def test_forward_concatenates_the_layers_hidden_states(lean):
    target = tiny_target("llama", layers=3)
    if not lean:
        target.lean = None
    assert (target.lean is not None) == lean
    ids = [1, 2, 3, 4]
    states = reference_states(target, ids + [5, 6])
    out = target.forward(torch.tensor(ids), features=(0, 2, 3))
    expected = torch.cat([states[i][:4] for i in (0, 2, 3)], dim=-1)
    torch.testing.assert_close(out.features, expected)
    assert out.features.shape == (4, 3 * target.hidden_size)
    target.commit([])
    out = target.forward(torch.tensor([5]), Draft.chain(torch.tensor([6])), features=(1, 3))
    torch.testing.assert_close(out.features, torch.cat([states[i][4:] for i in (1, 3)], dim=-1))
    torch.testing.assert_close(out.features[:, target.hidden_size:], states[-1][4:])  # id L: after the final norm


def test_layer_ids_outside_the_target_are_refused():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match=r"\[3\] outside \[0, 2\] for a target of 2 layers"):
        target.forward(torch.tensor([1, 2]), features=(0, 3))
    with pytest.raises(ValueError, match="non-empty tuple"):
        target.check_feature_layers(())


class LayerRecorder(sf.BaseDrafter):
    """Proposes nothing; records the features the loop hands it."""

    needs_features = (0, 1, 2)

    def __init__(self) -> None:
        super().__init__(gamma=1)
        self.seen: list[torch.Tensor] = []

    def propose(self, ctx, gamma):
        return Draft.empty()

    def observe(self, outcome):
        self.seen.append(outcome.features)


def test_the_loop_hands_a_drafter_the_layers_it_names():
    target = tiny_target("llama")
    drafter = LayerRecorder()
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=3)
    states = reference_states(target, [1, 2, 3, *result.tokens])
    rows = torch.cat(drafter.seen)  # prompt, then one position per pass
    torch.testing.assert_close(rows, torch.cat([s[: rows.shape[0]] for s in states], dim=-1))
