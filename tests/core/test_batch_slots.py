"""Drafters in batches: one copy per slot sharing the weights, the batched proposal call, and every registered drafter
giving each request its batch-1 greedy text inside a batch."""

import pytest
import torch

import specfamily as sf
from specfamily.core.batch_slots import SlotCopier, SlotTarget, propose_batch, slot_copy
from specfamily.core.context import DecodeContext
from specfamily.core.types import Draft, SamplingConfig
from specfamily.runtime.batch_cache import BatchCache
from specfamily.testing import tiny_target


@pytest.fixture(scope="module")
def code_target():
    torch.manual_seed(0)
    return sf.load_target("zoo:code-target")


@pytest.fixture(scope="module")
def code_prompts(code_target):
    texts = ["def add(a, b):\n    return", "import os\nimport sys\n\ndef main", "class Foo:\n    def __init__(self",
             "for i in range(10):"]
    return [code_target.tokenizer(t)["input_ids"] for t in texts]


def test_slot_copies_share_weights_and_named_state_and_own_the_rest(code_target):
    small = sf.create_drafter("small_model", code_target)
    copy = slot_copy(small, code_target)
    assert copy is not small and copy.draft is small.draft  # the draft model's module: shared, not copied
    assert next(copy.draft.parameters()) is next(small.draft.parameters())
    assert copy.runner is not small.runner and copy.runner.cache is not small.runner.cache  # its own KV cache
    assert copy.policy is not small.policy
    assert small.runner.tokenizer is not None and copy.runner.tokenizer is small.runner.tokenizer  # read-only: shared
    assert small.runner.lean is not None and copy.runner.lean is small.runner.lean  # its rope table, weight views
    medusa = sf.create_drafter("medusa", code_target)
    heads = slot_copy(medusa, code_target)  # batch_shared: read-only metadata, the tree and its index
    assert heads.checkpoint is medusa.checkpoint and heads.tree is medusa.tree and heads._gather is medusa._gather
    assert heads.policy is not medusa.policy
    suffix = sf.create_drafter("suffix", code_target)
    other = slot_copy(suffix, code_target)
    assert other.global_cache is suffix.global_cache  # batch_shared: learns across every slot's requests
    rest = sf.create_drafter("rest", code_target)
    assert slot_copy(rest, code_target).datastore is rest.datastore  # read-only, memory-mapped: not read into a copy
    layers = sf.create_drafter("self_spec", code_target)
    skipping = slot_copy(layers, code_target)  # the target's layers and its plan over them: read-only, shared
    assert skipping.runner is layers.runner and skipping.plan is layers.plan and skipping.kept is layers.kept
    assert skipping.policy is not layers.policy


def test_the_copier_does_not_walk_into_shared_attributes(code_target):
    """What a prototype names in ``batch_shared`` is shared whole, so the modules only it reaches are not walked
    (self_spec's runner holds the target model: walking its ~300 modules took 9 ms a run, its plan copied 90 objects
    a slot)."""
    copier = SlotCopier(sf.create_drafter("self_spec", code_target), code_target)
    assert not any(isinstance(value, torch.nn.Module) for value in copier._shared.values())


def test_a_copy_of_a_drafter_holding_its_slot_s_target_shares_that_view(code_target):
    """A drafter copied mid-request (suffix keeps its context, whose target is the slot's view) shares the view, as
    it shares the target: copying it used to recurse forever (its attribute lookup ran before it had a target)."""
    cache = BatchCache(code_target.model.config, 2, 16)
    view = SlotTarget(code_target, cache, 1)
    suffix = sf.create_drafter("suffix", code_target)
    suffix.begin(DecodeContext(view, torch.tensor([1, 2]), SamplingConfig(), torch.Generator(), tokens=[1, 2]))
    other = slot_copy(suffix, code_target)
    assert other._ctx.target is view and other._ctx is not suffix._ctx
    assert view.vocab_size == code_target.vocab_size and view.slot == 1


def test_slot_copies_see_a_hook_added_to_the_shared_draft_model_after_they_were_made(code_target):
    """A slot copy's lean forward watches the draft model's own hook tables (shared with the module), not copies
    made at admission that never see a hook added later: with one, the copy falls back to the model's forward."""
    small = sf.create_drafter("small_model", code_target)
    copier = SlotCopier(small, code_target)
    first, second = copier.copy(), copier.copy()
    assert first.runner is not second.runner and first.runner.cache is not second.runner.cache
    assert first.runner.lean is not None and first.runner.lean.ready() and second.runner.lean.ready()
    assert first.runner.lean._config is small.draft.config  # the module's config: shared, not copied
    handle = small.draft.model.layers[0].register_forward_hook(lambda module, args, out: None)
    try:
        assert not first.runner.lean.ready() and not second.runner.lean.ready()
    finally:
        handle.remove()
    assert first.runner.lean.ready()


class BareDrafter:
    """A third-party drafter written for batch 1 that does not derive from BaseDrafter: copies the context's last
    tokens (per-request state: the tokens it saw at begin)."""

    needs_features = False
    lossy = False

    def __init__(self):
        self.policy = sf.BaseDrafter(gamma=3).policy
        self.seen: list[int] | None = None

    def begin(self, ctx):
        self.seen = list(ctx.prompt_ids.tolist())

    def propose(self, ctx, gamma):
        assert ctx.tokens[: len(self.seen)] == self.seen  # its own request's context, never another slot's
        return Draft.chain(ctx.tokens[-gamma:])

    def observe(self, outcome):
        pass


def test_a_batch_1_drafter_outside_base_drafter_works_unchanged():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = [[1, 2, 3, 1, 2, 3], [5, 6], [7, 8, 9, 10]]
    reference = [sf.generate(target, None, p, max_new_tokens=15).tokens for p in prompts]
    results = sf.generate_batch(target, BareDrafter(), prompts, max_new_tokens=15, max_batch=2)
    assert [r.tokens for r in results] == reference
    assert all(r.metrics.draft_steps > 0 for r in results)


def test_each_slot_s_copy_serves_request_after_request_ended_before_it_begins_again(monkeypatch):
    """Four requests at max_batch=2: two copies of the prototype, each begun and ended around every request it
    serves (one drafter per slot, as one drafter serves request after request at batch 1), texts as at batch 1."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = [[1, 2, 3, 1, 2, 3], [5, 6], [7, 8, 9, 10], [4, 4, 4]]
    reference = [sf.generate(target, None, p, max_new_tokens=9).tokens for p in prompts]
    copies, calls = [], []
    own_copy = SlotCopier.copy

    def counted(self):
        copies.append(own_copy(self))
        return copies[-1]

    monkeypatch.setattr(SlotCopier, "copy", counted)
    own_begin = BareDrafter.begin
    monkeypatch.setattr(BareDrafter, "begin",
                        lambda self, ctx: calls.append((id(self), "begin", ctx.prompt_ids.tolist()))
                        or own_begin(self, ctx))
    monkeypatch.setattr(BareDrafter, "end", lambda self: calls.append((id(self), "end", None)), raising=False)
    results = sf.generate_batch(target, BareDrafter(), prompts, max_new_tokens=9, max_batch=2)
    assert [r.tokens for r in results] == reference
    assert len(copies) == 2 and sorted(c[2] for c in calls if c[1] == "begin") == sorted(prompts)
    for drafter in copies:
        own = [kind for who, kind, _ in calls if who == id(drafter)]
        assert own == ["begin", "end"] * (len(own) // 2) and len(own) >= 2


def test_propose_batch_loops_over_the_slots_with_gamma_0_as_an_empty_draft():
    target = tiny_target("llama", vocab_size=16)
    cache = BatchCache(target.model.config, 2)
    ctxs = [DecodeContext(SlotTarget(target, cache, i), torch.tensor(p), SamplingConfig(), torch.Generator(),
                          tokens=p) for i, p in enumerate([[1, 2, 3], [4, 5]])]
    drafters = [BareDrafter(), BareDrafter()]
    for d, c in zip(drafters, ctxs, strict=True):
        d.begin(c)
    drafts = propose_batch(drafters[0], drafters, ctxs, [2, 0])
    assert drafts[0].tokens.tolist() == [2, 3] and len(drafts[1]) == 0
    assert ctxs[1].target.cached_length == 0 and ctxs[1].target.vocab_size == 16  # the slot's view of the target


def test_medusa_drafts_every_slot_in_one_heads_call(code_target, code_prompts, monkeypatch):
    medusa = sf.create_drafter("medusa", code_target, gamma=3)
    calls = []
    heads = type(medusa.heads).forward

    def spy(self, features, *args, **kwargs):
        calls.append(tuple(features.shape))
        return heads(self, features, *args, **kwargs)

    monkeypatch.setattr(type(medusa.heads), "forward", spy)
    reference = [sf.generate(code_target, medusa, p, max_new_tokens=12, seed=i).tokens
                 for i, p in enumerate(code_prompts)]
    calls.clear()
    results = sf.generate_batch(code_target, medusa, code_prompts, max_new_tokens=12)
    assert [r.tokens for r in results] == reference
    assert calls and max(shape[0] for shape in calls) == len(code_prompts)  # (B, H): the whole batch at once
    assert all(len(shape) == 2 for shape in calls)


def _options(name, prompts, vocab_size, tmp_path):
    """What each family needs on the code target: random weights where the zoo ships none, a datastore for rest."""
    if name in ("eagle3", "hydra"):
        return {"weights": "random"}
    if name == "merge":
        return {"options": {"eagle3": {"weights": "random"}}}
    if name == "rest":
        from specfamily.drafters.rest.datastore import build_datastore

        sequences = [list(p) for p in prompts] * 2
        return {"datastore": str(build_datastore(sequences, tmp_path / "rest", vocab_size, progress=False))}
    return {}


@pytest.mark.parametrize("name", sf.list_drafters())
def test_every_registered_drafter_gives_each_request_its_batch_1_greedy_text(name, code_target, code_prompts,
                                                                              tmp_path):
    options = _options(name, code_prompts, code_target.vocab_size, tmp_path)
    drafter = sf.create_drafter(name, code_target, **options)
    reference = [sf.generate(code_target, drafter, p, max_new_tokens=16, seed=i).tokens
                 for i, p in enumerate(code_prompts)]
    drafter = sf.create_drafter(name, code_target, **options)
    results = sf.generate_batch(code_target, drafter, code_prompts, max_new_tokens=16, max_batch=3)
    assert [r.tokens for r in results] == reference
    plain = [r.tokens for r in sf.generate_batch(code_target, None, code_prompts, max_new_tokens=16)]
    assert plain == reference

