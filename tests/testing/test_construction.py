"""Power at depth by construction: the kit sharpens its tiny target toward a drafter's proposals when they seldom
get deep, and says what it could not reach."""

from __future__ import annotations

import pytest
import torch

from specfamily.core.types import Draft
from specfamily.testing import SAMPLING_MATRIX, ConformanceError, ConformanceWarning, assert_lossless, tiny_target
from specfamily.testing.construction import SMOOTHING, first_path, path_rows, sharpened
from specfamily.testing.drafters import RandomTreeDrafter
from specfamily.testing.rogues import HonestChain, LateMisreport
from specfamily.testing.setting import PROMPT
from specfamily.testing.tiny import single_thread


def test_the_first_path_follows_the_first_child_at_every_level():
    tree = Draft([4, 5, 6, 7, 5], [-1, -1, 0, 1, 3])
    assert first_path(tree) == [4, 6]
    assert first_path(Draft.chain([1, 2, 3])) == [1, 2, 3] and first_path(Draft.empty()) == []
    rows = path_rows([([1, 2], tree), ([3], Draft.chain([1, 2, 3])), ([3], Draft.empty())], depth=2)
    assert rows == [([1, 2, 4, 6], 2), ([3, 1, 2], 1)]


def test_sharpening_makes_the_drafted_tokens_likely_but_never_certain():
    target = tiny_target("llama")
    rows = [(list(PROMPT) + [5, 6], len(PROMPT))] * 4
    with single_thread():
        model = sharpened(target.model, rows, seed=0)
        with torch.inference_mode():
            before = torch.softmax(target.model(torch.tensor([list(PROMPT) + [5]])).logits[0], dim=-1)
            after = torch.softmax(model(torch.tensor([list(PROMPT) + [5]])).logits[0], dim=-1)
    kept = 1 - SMOOTHING + SMOOTHING / 8
    assert after[-2, 5] == pytest.approx(kept, abs=0.05) and after[-1, 6] == pytest.approx(kept, abs=0.05)
    assert before[-2, 5] < 0.5 and model is not target.model  # the author's target is left as it was


def test_an_honest_chain_whose_q_ignores_the_target_passes_with_the_defaults():
    """q = warp(target logits + 3 x a random tilt): it reaches depth 3 in ~10% of its requests on the kit's own
    target; the kit sharpens the target toward its proposals and tests depth 3 with power 0.9."""
    [fit] = assert_lossless(lambda target: HonestChain(target, noise=3.0), configs=SAMPLING_MATRIX[:1])
    assert fit.setting.sharpened and not fit.untested_depths and fit.depth_power >= 0.9, fit.describe()
    assert "sharpened toward the drafter's proposals" in fit.describe()


def test_a_dishonest_drafter_with_low_acceptance_fails_on_the_sharpened_target():
    """The same chain misreporting its q at depth 3: the depth is reached by construction, and the bug is caught
    there, in the level-3 tokens."""
    with pytest.raises(ConformanceError, match="not lossless under") as info:
        assert_lossless(lambda target: LateMisreport(target, noise=3.0, strength=3.0), configs=SAMPLING_MATRIX[:1])
    fit = info.value.fit
    assert fit.setting.sharpened and fit.worst.name.startswith("level 3"), fit.describe()


def test_drafts_of_noise_cannot_be_sharpened_toward_and_pass_with_a_warning():
    """Deterministic random tokens: no target continues noise, so depth 3 stays out of reach; the honest drafter
    passes and the warning says what was not tested, and why."""
    untested = r"depth 2, 3 not tested to power 0\.9.*sharpening the target toward its proposals did not get there"
    with pytest.warns(ConformanceWarning, match=untested):
        [fit] = assert_lossless(lambda target: RandomTreeDrafter(target, nodes=3), configs=SAMPLING_MATRIX[:1])
    assert fit.untested_depths == [2, 3] and not fit.setting.sharpened
