"""eagle3 on the real target zoo:smollm2 (slow): greedy identity against transformers' own ``generate`` on
Spec-Bench first turns (chat template), chain and tree, at a constant draft length so every pass drafts.

No EAGLE-3 weights are shipped for SmolLM2 yet, so two kinds of drafter stand in (feature layers the reference's
default 2, 15, 27 of 30): seeded random ones, whose drafts are nearly always rejected (the full-vocabulary head and
a reduced draft vocabulary, d2t over 16384 ids), and one briefly trained here with the eagle3 trainer (40 steps,
4096-token draft vocabulary) on the very prompts and continuations it then decodes, so that some drafts are
accepted and the accepted paths (partial acceptance, cache rollback, the bonus token) run on the real target. Its
acceptance says nothing about EAGLE-3's quality; it only makes the identity check cover accepted drafts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eval_helpers import greedy_reference, spec_bench_first_turns

import specfamily as sf

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 48
REDUCED = list(range(0, 49152, 3))  # 16384 target ids: a draft vocabulary with gaps, mapped through d2t
DRAFTERS = {
    "chain gamma=3": {"mode": "chain", "gamma": 3},
    "tree gamma=4": {"mode": "tree", "gamma": 4},
    "tree reduced-vocabulary gamma=3": {"mode": "tree", "gamma": 3, "top_k": 3, "total_tokens": 10,
                                        "draft_vocab": REDUCED},
    "chain reduced-vocabulary gamma=4": {"mode": "chain", "gamma": 4, "draft_vocab": REDUCED},
}


@pytest.fixture(scope="module")
def target():
    threads = torch.get_num_threads()
    yield sf.load_target("zoo:smollm2")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts(target) -> list[list[int]]:
    return spec_bench_first_turns(target.tokenizer)


@pytest.fixture(scope="module")
def reference(target, prompts) -> list[list[int]]:
    return greedy_reference(target.model, prompts, MAX_NEW_TOKENS)


TRAINED = {"trained chain gamma=3": {"mode": "chain", "gamma": 3}, "trained tree gamma=3": {"mode": "tree", "gamma": 3}}


@pytest.fixture(scope="module")
def trained(prompts, reference, tmp_path_factory) -> str:
    """An eagle3 folder trained 40 steps (about 2 minutes on a CPU core) on the prompts and their continuations."""
    from specfamily.drafters.eagle3.train import main as train

    folder = tmp_path_factory.mktemp("eagle3")
    tokens = np.concatenate([np.asarray(p + r, dtype=np.uint16) for p, r in zip(prompts, reference, strict=True)])
    np.save(folder / "tokens.npy", tokens)
    train(["--target", "zoo:smollm2", "--out", str(folder / "out"), "--tokens", str(folder / "tokens.npy"),
           "--heldout-fraction", "0.05", "--steps", "40", "--minutes", "0", "--batch", "2", "--seq-len", "64",
           "--lr", "1e-3", "--warmup", "5", "--ttt-length", "3", "--draft-vocab", "4096", "--eval-every", "40",
           "--ckpt-every", "1000", "--eval-windows", "2", "--save-dtype", "float32", "--seed", "0"])
    return str(folder / "out")


def _decode_all(target, drafter, prompts, reference, label: str) -> tuple[list[float], int]:
    """Decode every prompt; assert transformers' tokens; (drafted share per prompt, accepted draft tokens)."""
    shares, accepted = [], 0
    for ids, expected in zip(prompts, reference, strict=True):
        result = sf.generate(target, drafter, ids, MAX_NEW_TOKENS)
        assert result.tokens == expected, f"eagle3 {label} differs on a {len(ids)}-token prompt"
        assert result.metrics.proposed_tokens > 0
        shares.append(result.metrics.drafted_share)
        accepted += result.metrics.accepted_tokens
    print(label, "drafted share per prompt", shares, "accepted", accepted)
    assert len(prompts) >= 10 and min(shares) >= 0.9  # a draft verified on (nearly) every pass after the prefill
    return shares, accepted


@pytest.mark.parametrize("label", TRAINED)
def test_briefly_trained_eagle3_greedy_output_equals_generate_with_drafts_accepted(target, prompts, reference,
                                                                                   trained, label):
    drafter = sf.create_drafter("eagle3", target, weights=trained, **TRAINED[label])
    assert drafter.needs_features == (2, 15, 27) and drafter.model.vocab.size == 4096
    _, accepted = _decode_all(target, drafter, prompts, reference, label)
    assert accepted > 0


@pytest.mark.parametrize("label", DRAFTERS)
def test_seeded_eagle3_greedy_output_equals_generate_on_spec_bench(target, prompts, reference, label):
    drafter = sf.create_drafter("eagle3", target, weights="random", seed=7, **DRAFTERS[label])
    assert drafter.needs_features == (2, 15, 27)  # the reference's low, middle and high layers of 30
    _decode_all(target, drafter, prompts, reference, label)
