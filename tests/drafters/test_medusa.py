import pytest
import torch
from torch import nn

import specfamily as sf
from specfamily.core.policy import make_policy
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.medusa.calibrate import target_features
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.heads import HeadsShape, build_heads, shape_for
from specfamily.drafters.medusa.objective import medusa_loss
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, tiny_target

PROMPT = [3, 1, 4, 1, 5]


def _perturbed(target, seed=0, scale=0.3):
    drafter = MedusaDrafter(target, weights="random")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.heads.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return drafter


def _plain(target, prompt, n):
    return sf.generate(target, None, prompt, max_new_tokens=n).tokens


class OracleHeads(nn.Module):
    """Heads that know the target's greedy text: for the feature at position t, head k puts its top logit on the
    token at t + 2 + k. Only a correctly aligned drafter gets every proposal accepted."""

    def __init__(self, target, sequence: list[int], num_heads: int) -> None:
        super().__init__()
        self.shape = HeadsShape(num_heads, target.hidden_size, target.vocab_size)
        self.sequence, self.vocab = sequence, target.vocab_size
        self.features = target_features(target.model, torch.tensor([sequence]))[0]  # (S, H)

    def forward(self, feature, num_heads=None):
        t = int((self.features - feature).norm(dim=-1).argmin())
        logits = torch.zeros(num_heads or self.shape.num_heads, self.vocab, dtype=feature.dtype)
        for k in range(logits.shape[0]):
            if t + 2 + k < len(self.sequence):
                logits[k, self.sequence[t + 2 + k]] = 1.0
        return logits


@pytest.mark.parametrize("tree", ["chain", [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)]])
def test_head_k_on_the_last_feature_proposes_the_token_after_the_root_plus_k(tree):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    n = 21
    reference = _plain(target, PROMPT, n + 8)
    drafter = MedusaDrafter.from_heads(target, OracleHeads(target, PROMPT + reference, 4), tree=tree, policy="constant")
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=n)
    assert result.tokens == reference[:n]
    assert result.metrics.acceptance_rate == 1.0
    assert result.metrics.target_passes == 5  # prefill (1 token), then 4 passes of 4 accepted + 1
    assert result.metrics.mean_accepted_length == pytest.approx(n / 5)


def test_first_pass_is_a_plain_prefill_and_observe_keeps_the_last_feature():
    target = tiny_target("llama", vocab_size=32)
    drafter = MedusaDrafter(target, weights="random")
    ctx = sf.DecodeContext(target, torch.tensor(PROMPT), sf.SamplingConfig(), torch.Generator())
    drafter.begin(ctx)
    assert len(drafter.propose(ctx, 4)) == 0
    features = torch.randn(3, target.hidden_size, dtype=torch.float64)
    drafter.observe(VerifyOutcome([7, 8], [0], 4, features, 4))
    draft = drafter.propose(ctx, 4)
    assert len(draft) == drafter.tree.size and draft.q is None
    assert draft.parents.tolist() == drafter.tree.parents.tolist()
    # node tokens: rank r of head d - 1 on the last feature row
    top = drafter.heads(features[-1]).topk(drafter.tree.top_k, dim=-1).indices
    expected = [int(top[d - 1, r]) for d, r in zip(drafter.tree.depths.tolist(), drafter.tree.ranks.tolist(),
                                                     strict=True)]
    assert draft.tokens.tolist() == expected
    drafter.begin(ctx)  # a new request forgets the feature
    assert len(drafter.propose(ctx, 4)) == 0


def test_observe_without_features_is_an_error():
    drafter = MedusaDrafter(tiny_target("llama", vocab_size=16), weights="random")
    with pytest.raises(RuntimeError, match="needs the target's features"):
        drafter.observe(VerifyOutcome([1], [], 0))


def test_siblings_are_distinct_and_gamma_cuts_the_tree():
    target = tiny_target("llama", vocab_size=32)
    drafter = _perturbed(target)
    ctx = sf.DecodeContext(target, torch.tensor(PROMPT), sf.SamplingConfig(), torch.Generator())
    drafter.begin(ctx)
    drafter.observe(VerifyOutcome([1], [], 0, torch.randn(1, target.hidden_size, dtype=torch.float64), 0))
    draft = drafter.propose(ctx, 2)
    assert len(draft) == drafter.tree.prefix[2] and int(draft.depths().max()) == 2
    pairs = list(zip(draft.parents.tolist(), draft.tokens.tolist(), strict=True))
    assert len(set(pairs)) == len(pairs)


def test_greedy_equals_transformers_with_random_heads():
    reports = assert_greedy_equivalent(lambda t: _perturbed(t))  # driven at the helper's constant gamma
    assert all(report.proposed_tokens > 0 and report.depth.trees > 0 for report in reports)


def _trained(target, steps=15):
    """Heads trained for a few steps on the target's own greedy text (the conformance suite runs in inference mode)."""
    with torch.inference_mode(False), torch.enable_grad():
        return _train_steps(target, steps)


def _train_steps(target, steps):
    drafter = MedusaDrafter(target, weights="random")
    heads = drafter.heads.train()
    ids = torch.randint(0, target.vocab_size, (4, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ids = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                                    min_new_tokens=40, pad_token_id=0)
    features = target_features(target.model, ids)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = medusa_loss(heads, features, ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    heads.eval()
    return drafter


def test_greedy_equals_transformers_with_trained_heads():
    reports = assert_greedy_equivalent(_trained)
    assert all(report.proposed_tokens > 0 and report.depth.deepest_accepted >= 1 for report in reports)


def test_training_on_the_targets_text_raises_tau():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    prompt = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(0)).tolist()
    before = sf.generate(target, MedusaDrafter(target, weights="random", policy="constant"), prompt, max_new_tokens=30)
    trained = _trained(target, steps=60)
    trained.policy = make_policy("constant", trained.tree.depth)  # tau at the tree's depth, not at timed lengths
    after = sf.generate(target, trained, prompt, max_new_tokens=30)
    assert after.tokens == before.tokens == _plain(target, prompt, 30)
    assert after.metrics.mean_accepted_length > before.metrics.mean_accepted_length + 0.5


def test_lossless_tree_sampling():
    # its calibrated tree reaches depth 3 in ~5% of samples on the tiny target: depth 2 held to power 0.9
    assert_lossless(lambda t: _perturbed(t, scale=0.1), configs=SAMPLING_MATRIX[:1], min_depth=2)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("tree", [None, "chain"])
def test_lossless_full_matrix(family, tree):
    assert_lossless(lambda t: _perturbed(t, scale=0.1) if tree is None else MedusaDrafter(t, weights="random",
                                                                                          tree=tree), family=family,
                    min_depth=2 if tree is None else 1)  # random heads: a chain's depth 2 in ~35% of samples


def test_registered_with_its_schema():
    target = tiny_target("llama", vocab_size=16)
    assert "medusa" in sf.list_drafters()
    drafter = sf.create_drafter("medusa", target, weights="random", tree="chain", gamma=3)
    assert isinstance(drafter, MedusaDrafter) and drafter.needs_features and not drafter.lossy
    assert drafter.tree.paths == ((0,), (0, 0), (0, 0, 0))
    with pytest.raises(TypeError, match="unknown option 'heads'"):
        sf.create_drafter("medusa", target, weights="random", heads=3)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (dict(gamma=5), ValueError, r"gamma \(tree depth\) 5 exceeds the number of Medusa heads \(4\)"),
        (dict(tree=[(0,), (0, 0)], num_heads=1), ValueError, "tree depth 2 exceeds the number of Medusa heads"),
        (dict(tree=[(20,)]), ValueError, "tree uses rank 20, outside the vocabulary of 16 tokens"),
        (dict(tree="wide"), ValueError, "tree must be None, 'chain' or a list of rank paths"),
        (dict(num_heads=0), ValueError, "num_heads must be an integer >= 1, got 0"),
        (dict(typical=1), TypeError, "typical must be a bool"),
        (dict(weights=3), TypeError, "weights must be a path, a zoo: name or 'random'"),
    ],
)
def test_bad_options_are_refused(options, error, message):
    target = tiny_target("llama", vocab_size=16)
    with pytest.raises(error, match=message):
        MedusaDrafter(target, **{"weights": "random", **options})


def test_default_weights_are_the_zoo_heads_made_for_the_target(monkeypatch):
    import specfamily.zoo as zoo

    target = tiny_target("llama", vocab_size=16)
    with pytest.raises(ValueError, match=r"there are no medusa weights for this target in the zoo.*"
                                         r"`python -m specfamily\.drafters\.medusa\.train --target "):
        MedusaDrafter(target)  # a target the zoo's catalogue does not know
    asked = []

    def fake_zoo_path(name):
        asked.append(name)
        raise FileNotFoundError(f"zoo model {name!r} is not shipped")

    monkeypatch.setattr(zoo, "identify", lambda model: "zoo:code-target")  # as if it were the zoo target
    monkeypatch.setattr(zoo, "zoo_path", fake_zoo_path)
    with pytest.raises(FileNotFoundError, match="'zoo:code-medusa' is not shipped"):
        MedusaDrafter(target)
    assert asked == ["zoo:code-medusa"]


def test_shared_lm_head_drafter_is_exact_under_greedy():
    target = tiny_target("gpt2", vocab_size=64, spread=1.0)
    drafter = MedusaDrafter(target, weights="random", share_lm_head=True, num_heads=3, gamma=3)
    assert drafter.tree.depth <= 3
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=20)
    assert result.tokens == _plain(target, PROMPT, 20)
    assert result.metrics.proposed_tokens > 0


def test_heads_follow_the_target_dtype():
    target = tiny_target("llama", vocab_size=16, dtype=torch.float32)
    drafter = MedusaDrafter(target, weights="random")
    assert all(p.dtype == torch.float32 for p in drafter.heads.parameters())
    assert isinstance(build_heads(target, shape_for(target)).heads[0].proj, nn.Linear)
