import pytest
import torch

import specfamily as sf
from specfamily.core.loop import truncate
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import DraftProbabilityError
from specfamily.testing import OracleDrafter, RandomTreeDrafter, tiny_model, tiny_target


def _hf_greedy(target, prompt, n):
    ids = torch.tensor([prompt])
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_plain_decoding_equals_transformers_greedy(family, attn):
    target = tiny_target(family, vocab_size=64, spread=1.0, dtype=torch.float32, attn=attn)
    prompt = [5, 9, 2, 33, 7]
    result = sf.generate(target, None, prompt, max_new_tokens=20)
    assert result.tokens == _hf_greedy(target, prompt, 20)
    assert result.metrics.target_passes == 20
    assert result.metrics.mean_accepted_length == 1.0


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_random_tree_drafter_equals_greedy_on_many_prompts(family):
    """>= 20 prompts x 64 tokens, fp32, against transformers' generate."""
    target = tiny_target(family, vocab_size=64, spread=1.0, dtype=torch.float32)
    drafter = RandomTreeDrafter(target, gamma=3, nodes=8)
    gen = torch.Generator().manual_seed(0)
    for i in range(20):
        prompt = torch.randint(0, 64, (2 + i,), generator=gen).tolist()
        assert sf.generate(target, drafter, prompt, max_new_tokens=64).tokens == _hf_greedy(target, prompt, 64)


def test_oracle_accepts_everything_and_stops_exactly_at_budget():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    result = sf.generate(target, OracleDrafter(target, gamma=4), [1, 2, 3], max_new_tokens=13)
    assert len(result.tokens) == 13
    assert result.metrics.acceptance_rate == 1.0
    # passes: gamma 4 accepts 5 tokens per pass; the last pass drafts only what the budget allows
    assert result.metrics.target_passes == 3
    assert result.tokens == _hf_greedy(target, [1, 2, 3], 13)


def test_truncate_stops_after_eos_inside_an_accepted_block():
    assert truncate([4, 0, 5, 6], budget=10, eos_token_ids=0) == ([4, 0], True)
    assert truncate([4, 5, 6], budget=2, eos_token_ids=0) == ([4, 5], True)
    assert truncate([4, 5], budget=3, eos_token_ids=None) == ([4, 5], False)
    assert truncate([4, 7, 5, 3], budget=10, eos_token_ids=(3, 5)) == ([4, 7, 5], True)  # any end id stops


def test_generation_stops_at_eos_even_when_drafted_past_it():
    model = tiny_model("llama", vocab_size=16, spread=1.0, dtype=torch.float32)
    target = sf.load_target(model)
    plain = sf.generate(target, None, [1, 2], max_new_tokens=30).tokens
    eos = plain[5]
    model.generation_config.eos_token_id = eos
    target = sf.load_target(model)
    ours = sf.generate(target, OracleDrafter(target, gamma=8), [1, 2], max_new_tokens=30).tokens
    assert ours == plain[: plain.index(eos) + 1]
    assert ours[-1] == eos


def test_same_seed_same_tokens_under_sampling():
    target = tiny_target("llama", vocab_size=16)
    drafter = RandomTreeDrafter(target, sampled=True)
    sampling = sf.SamplingConfig(temperature=0.8, top_k=6)
    a = sf.generate(target, drafter, [1, 2], 12, sampling, seed=3).tokens
    b = sf.generate(target, drafter, [1, 2], 12, sampling, seed=3).tokens
    assert a == b
    others = {tuple(sf.generate(target, drafter, [1, 2], 12, sampling, seed=seed).tokens) for seed in (4, 5, 6)}
    assert others - {tuple(a)}, "other seeds gave the same tokens: the seed is not used"


def test_features_reach_observe_aligned_with_positions():
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    seen = []

    class Recorder(OracleDrafter):
        needs_features = True

        def observe(self, outcome):
            seen.append(outcome)

    sf.generate(target, Recorder(target, gamma=3), [1, 2, 3, 4], max_new_tokens=9)
    first, second = seen[0], seen[1]
    assert first.feature_start == 0 and first.features.shape[0] == 4 + 3  # prompt + 3 accepted nodes
    assert second.feature_start == first.features.shape[0]
    lm_head = target.model.get_output_embeddings()
    predicted = lm_head(first.features).argmax(-1).tolist()
    assert predicted[3:] == first.tokens  # the feature at position t predicts the token at t + 1


def test_features_reach_observe_in_path_order_on_tree_branches_and_idle_passes():
    """The rows observe gets are the pending rows, then the accepted nodes' in path order, each a copy: on passes that
    draft nothing, and on a tree whose accepted path skips its first nodes (a wrong first branch, the target's chain
    as the second) as well as on one whose path is its first nodes."""
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    seen = []

    class Branches(OracleDrafter):
        needs_features = True

        def propose(self, ctx, gamma):
            right, turn = self.continuation[len(ctx.tokens) : len(ctx.tokens) + 2], len(seen) % 3
            if turn == 0:
                return Draft.empty()  # a pass that drafts nothing
            if turn == 1 or len(right) < 2:
                return Draft(torch.tensor(right), torch.tensor([-1, 0][: len(right)]))  # the path is nodes 0, 1
            wrong = (right[0] + 1) % 32
            return Draft(torch.tensor([wrong, wrong, *right]), torch.tensor([-1, 0, -1, 2]))  # path: nodes 2, 3

        def observe(self, outcome):
            seen.append(outcome)

    result = sf.generate(target, Branches(target, gamma=2), [1, 2, 3, 4], max_new_tokens=30)
    assert result.tokens == sf.generate(target, None, [1, 2, 3, 4], max_new_tokens=30).tokens
    paths = [o.accepted_nodes for o in seen]
    assert [2, 3] in paths and [0, 1] in paths and [] in paths  # both ways of gathering rows were exercised
    lm_head = target.model.get_output_embeddings()
    for outcome in seen:
        predicted = lm_head(outcome.features).argmax(-1).tolist()
        assert predicted[-len(outcome.tokens) :] == outcome.tokens  # row j's feature predicts the next token
        assert outcome.features.shape[0] == (4 if outcome.feature_start == 0 else 1) + len(outcome.accepted_nodes)
    assert len({o.features.untyped_storage().data_ptr() for o in seen}) == len(seen)  # copies, none shared


def test_logits_of_every_drafted_row_reach_observe():
    """observe gets the pass's (draft_size + 1, V) logits: row 0 at the root, row i + 1 after node i, drafted nodes
    accepted or not; each row equals the target's own logits after that node's path."""
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    seen = []

    class Recorder(RandomTreeDrafter):
        def propose(self, ctx, gamma):
            draft = super().propose(ctx, gamma)
            seen.append((list(ctx.tokens), draft))
            return draft

        def observe(self, outcome):
            seen[-1] += (outcome.logits.clone(),)

    sf.generate(target, Recorder(target, gamma=3, nodes=6), [1, 2, 3, 4], max_new_tokens=12)
    checked = 0
    for context, draft, logits in (case for case in seen if len(case) == 3):
        assert logits.shape == (len(draft) + 1, 32)
        for i in range(len(draft) + 1):
            path = [] if i == 0 else _path(draft, i - 1)
            ids = torch.tensor([context + [int(draft.tokens[j]) for j in path]])
            with torch.inference_mode():
                expected = target.model(input_ids=ids).logits[0, -1]
            torch.testing.assert_close(logits[i], expected, rtol=1e-9, atol=1e-9)
            checked += 1
    assert checked >= 3 * 7  # three passes or more, six drafted nodes and the root each


def _path(draft, node):
    parents, path = draft.parents.tolist(), []
    while node >= 0:
        path.insert(0, node)
        node = parents[node]
    return path


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"prompt_ids": []}, ValueError, "prompt is empty"),
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be >= 0, got -1"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens must be an int, got float"),
        ({"sampling": {"temperature": 1}}, TypeError, "sampling must be a specfamily.SamplingConfig, got dict"),
        ({"drafter": object()}, TypeError, "drafter must implement begin/propose/observe, got object"),
    ],
)
def test_bad_requests(kwargs, error, message):
    target = tiny_target("llama", vocab_size=16)
    args = {"drafter": None, "prompt_ids": [1, 2], "max_new_tokens": 4} | kwargs
    with pytest.raises(error) as info:
        sf.generate(target, **args)
    assert message in str(info.value)


def test_token_outside_vocabulary():
    target = tiny_target("llama", vocab_size=16)
    with pytest.raises(ValueError, match="16"):
        sf.generate(target, None, [1, 99], max_new_tokens=2)


class _NanQ(sf.BaseDrafter):
    """Reports an all-NaN q for a sampled chain (a float16 softmax that overflowed)."""

    def __init__(self, target):
        super().__init__(2, "constant")

    def propose(self, ctx, gamma):
        tokens = ctx.tokens[-gamma:]
        return Draft.chain(tokens, torch.full((len(tokens), ctx.target.vocab_size), float("nan")))


def test_generate_refuses_a_drafter_whose_q_is_not_a_distribution():
    target = tiny_target("llama")
    with pytest.raises(DraftProbabilityError, match=r"drafter _NanQ: q of draft node 0 is not a distribution: 8 "
                       r"non-finite entries"):
        sf.generate(target, _NanQ(target), [1, 2, 3], max_new_tokens=8, sampling=SamplingConfig(temperature=1.0))


class _ThreeMethodPolicy:
    """A third-party policy with only the required methods: every third pass plain, else 3 tokens."""

    def __init__(self):
        self.asked = 0
        self.updates = []

    def reset(self):
        pass

    def next_gamma(self):
        self.asked += 1
        return 0 if self.asked % 3 == 0 else 3

    def update(self, proposed, accepted, c=None, tokens=None, verified=None, overhead=None):
        self.updates.append((proposed, accepted))


class _TimedPolicy(_ThreeMethodPolicy):
    """The same, with the optional ``timed`` hook: records what the loop says each pass cost."""

    def __init__(self):
        super().__init__()
        self.timed_passes = []

    def timed(self, tokens, seconds):
        self.timed_passes.append((tokens, seconds, len(self.updates)))


@pytest.mark.parametrize("policy_class", [_ThreeMethodPolicy, _TimedPolicy])
def test_a_policy_gets_each_pass_time_only_if_it_has_the_timed_hook(policy_class):
    """Greedy text equals plain decoding either way; with the hook, every pass after the prefill that the policy is
    told about is timed (plain passes too, with 0 draft tokens) before its update."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    drafter = OracleDrafter(target, gamma=3)
    drafter.policy = policy = policy_class()
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=30)
    assert result.tokens == _hf_greedy(target, [1, 2, 3], 30)
    assert len(policy.updates) == result.metrics.target_passes - 1  # the last pass is not reported
    assert (0, 0) in policy.updates and (3, 3) in policy.updates  # plain and drafted passes both ran
    if policy_class is _TimedPolicy:
        sizes = [proposed for proposed, _ in policy.updates[1:]]  # the prefill pass is not timed
        assert [tokens for tokens, _, _ in policy.timed_passes] == sizes
        assert [before for _, _, before in policy.timed_passes] == list(range(1, len(policy.updates)))
        assert all(seconds > 0 for _, seconds, _ in policy.timed_passes)


def test_auto_policy_measures_the_runs_own_passes_through_the_loop():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    target.verify_costs = {0: 1.0, 8: 1.0}  # a flat curve: no timing at bind
    drafter = OracleDrafter(target, policy="auto")
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=40)
    assert result.tokens == _hf_greedy(target, [1, 2, 3], 40)
    costs = drafter.policy.costs
    assert costs.plain_seconds is not None and costs.points  # a plain pass measured, drafted sizes scaled
    assert "plain pass" in result.metrics.policy_note and "x measured" in result.metrics.policy_note
