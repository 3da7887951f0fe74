"""What a conformance run tests: the author's tiny target, prompt, tokens and depth, refused when untestable."""

from __future__ import annotations

import pytest
import torch

from specfamily.testing import SAMPLING_MATRIX, KitSetting, assert_lossless
from specfamily.testing.levels import PAD
from specfamily.testing.rogues import HonestChain
from specfamily.testing.sampling_run import exact_steps, joint_law, sample_run
from specfamily.testing.setting import PROMPT, make_setting


def test_the_default_setting_says_what_it_tests():
    assert KitSetting().describe() == ("tiny llama target (vocabulary 8, no EOS, seed 0), prompt (1, 2, 3), 5 new "
                                       "tokens, gamma 3")
    assert KitSetting("gpt2", 16, eos=2, gamma=None).describe() == (
        "tiny gpt2 target (vocabulary 16, EOS 2, seed 0), prompt (1, 2, 3), 5 new tokens, the drafter's own policy")


def test_the_tokens_and_the_depth_follow_gamma():
    setting, min_depth = make_setting("llama", 8, None, PROMPT, None, 4, None)
    assert (setting.n_tokens, min_depth, setting.depth) == (6, 4, 4)  # a warm-up pass, depth 4, its bonus token
    setting, min_depth = make_setting("llama", 8, None, PROMPT, None, None, None)
    assert (setting.n_tokens, min_depth, setting.depth) == (5, 3, 4)  # own policy: every level the budget allows


@pytest.mark.parametrize(("options", "message"), [
    ({"n_tokens": 8}, r"vocab 8 and n_tokens 8 make 16,777,216 sequences to enumerate for the exact law; the kit's "
                      r"limit is 2,097,152"),
    ({"gamma": 3, "n_tokens": 3}, r"n_tokens 3 leaves no room for a depth-3 draft: .* needs n_tokens >= 4 \(5 for a "
                                  r"drafter that drafts from its second pass"),
    ({"eos": 8}, r"eos must be a token id in \[0, 8\), got 8"),
    ({"prompt": (9,)}, r"the prompt must be non-empty token ids in \[0, 8\)"),
    ({"min_depth": 4}, r"min_depth \(4\) cannot exceed the draft length gamma \(3\)"),
    ({"family": "bert"}, r"unknown tiny family 'bert'"),
    ({"gamma": 0}, r"gamma must be >= 1"),
])
def test_a_setting_the_kit_cannot_test_is_refused_before_anything_runs(options, message):
    def factory(target):
        raise AssertionError("the kit built a drafter for a setting it refuses")

    with pytest.raises(ValueError, match=message):
        assert_lossless(factory, configs=SAMPLING_MATRIX[:1], **options)


def test_an_eos_ends_generation_and_the_law_treats_it_as_absorbing():
    setting = KitSetting(eos=0)
    target = setting.target()
    assert target.eos_token_ids == (0,)
    steps = exact_steps(target, PROMPT, 3, SAMPLING_MATRIX[0])
    assert joint_law(steps).sum().item() == pytest.approx(1.0)
    assert torch.equal(steps[2].view(8, 8, 8)[0, 5], torch.nn.functional.one_hot(torch.tensor(0), 8).double())
    run = sample_run(target, None, PROMPT, 3, SAMPLING_MATRIX[0], 300)
    ended = run.sequences[:, 0] == 0
    assert 0 < int(ended.sum()) < 300  # some requests stopped at the first token
    assert bool((run.sequences[ended] == 0).all()) and bool((run.levels[ended, 1:] == PAD).all())


def test_an_honest_drafter_passes_on_a_target_with_an_eos_and_the_verdict_says_so():
    [fit] = assert_lossless(HonestChain, configs=SAMPLING_MATRIX[:1], eos=0)
    assert "EOS 0" in fit.describe() and fit.setting.eos == 0 and fit.depth_power >= 0.9, fit.describe()


def test_the_false_alarm_rate_is_shared_by_the_configs_of_one_call():
    fits = assert_lossless(lambda target: None, configs=SAMPLING_MATRIX, samples=300)
    assert [fit.significance for fit in fits] == pytest.approx([1e-3 / 3] * 3)
    [single] = assert_lossless(lambda target: None, configs=SAMPLING_MATRIX[:1], samples=300)
    assert single.significance == pytest.approx(1e-3)
