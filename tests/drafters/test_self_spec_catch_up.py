"""self_spec's first proposal feeds the whole prompt through its draft layers: that pass is catch-up, not c."""

import torch

import specfamily as sf
from specfamily.core.context import DecodeContext
from specfamily.drafters.self_spec import drafter as drafter_module
from specfamily.drafters.self_spec.drafter import SelfSpecDrafter
from specfamily.testing import tiny_target


class RowClock:
    """A fake clock that advances one second per row a draft pass feeds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _counting(drafter: SelfSpecDrafter, clock: RowClock, rows: list[int]):
    passes = drafter._passes

    def counted(target):
        hidden_of, logits_of = passes(target)

        def hidden(ids, positions, mask, cache):
            rows.append(ids.shape[1])
            clock.now += ids.shape[1]
            return hidden_of(ids, positions, mask, cache)

        return hidden, logits_of

    return counted


@torch.inference_mode()
def test_the_first_proposal_reports_its_prompt_pass_as_catch_up(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = SelfSpecDrafter(target, skip=["mlp:1"], gamma=4)
    clock, rows = RowClock(), []
    monkeypatch.setattr(drafter_module, "device_clock", lambda device: clock)
    monkeypatch.setattr(drafter, "_passes", _counting(drafter, clock, rows))
    prompt = [5, 6, 7, 8, 9, 10, 11]
    ids = target.check_ids(prompt)
    ctx = DecodeContext(target, ids, sf.SamplingConfig(), torch.Generator().manual_seed(0), ids.tolist())
    target.reset()

    first = drafter.propose(ctx, 4)  # the cache is empty: all 7 prompt tokens are pending
    assert rows == [7, 1, 1, 1]
    assert first.catch_up_seconds == 7.0  # exactly the prompt's pass: the draft cost left is the 3 one-row steps
    assert clock.now - first.catch_up_seconds == 3.0

    out = target.forward(ids, first)
    target.commit([])
    ctx.tokens.append(int(out.logits[0].argmax()))
    rows.clear()
    second = drafter.propose(ctx, 4)  # one pending token (the root): nothing to catch up on
    assert rows == [1, 1, 1, 1]
    assert second.catch_up_seconds == 0.0


def test_a_generated_request_counts_the_prompt_pass_as_catch_up(monkeypatch):
    """Through the loop: the first pass's catch-up is in the metrics, and the c the policy is told for it leaves
    the prompt's draft pass out (its draft time less the catch-up, per step, over the verification)."""
    from specfamily.core import loop

    target = tiny_target("llama", vocab_size=64, spread=1.0)
    reports = []
    report = loop._report

    def recorded(policy, draft, depth, accepted, draft_seconds, verify_seconds, asked=False):
        reports.append((draft.catch_up_seconds, draft_seconds, depth))
        return report(policy, draft, depth, accepted, draft_seconds, verify_seconds, asked)

    monkeypatch.setattr(loop, "_report", recorded)
    prompt = list(range(3, 3 + 48))
    result = sf.generate(target, SelfSpecDrafter(target, skip=["mlp:1"], gamma=3), prompt, max_new_tokens=8)
    catch_up, draft_seconds, depth = reports[0]
    assert depth == 3 and 0 < catch_up <= draft_seconds
    assert all(c == 0.0 for c, _, _ in reports[1:])
    assert result.metrics.catch_up_seconds == catch_up


def test_in_batches_each_newcomer_reports_its_prompts_share_as_catch_up(monkeypatch):
    """The batched proposal: a slot whose first pass feeds its prompt reports catch-up; a slot feeding its root
    alone reports none, in the same pass or later."""
    target = sf.load_target("zoo:code-target")
    texts = ["def add(a, b):\n    return", "import os\nimport sys\n\ndef main", "class Foo:\n    def __init__(self",
             "for i in range(10):", "x = [i * i for i in"]
    prompts = [target.tokenizer(t)["input_ids"] for t in texts]
    seen = []  # (pending rows, gamma, catch-up) of every slot of every batched proposal
    propose_batch = SelfSpecDrafter.propose_batch

    def spy(self, drafters, ctxs, gammas):
        pending = [len(ctx.tokens) - ctx.target.cached_length for ctx in ctxs]
        drafts = propose_batch(self, drafters, ctxs, gammas)
        seen.extend(zip(pending, gammas, (d.catch_up_seconds for d in drafts), strict=True))
        return drafts

    monkeypatch.setattr(SelfSpecDrafter, "propose_batch", spy)
    drafter = sf.create_drafter("self_spec", target, skip=["layer:1", "mlp:2"], gamma=3)
    sf.generate_batch(target, drafter, prompts, max_new_tokens=12, max_batch=3)  # two newcomers join later
    newcomers = [c for m, g, c in seen if m > 1 and g > 0]
    steady = [c for m, g, c in seen if m == 1]
    assert len(newcomers) >= 3 and all(c > 0 for c in newcomers)
    assert steady and all(c == 0.0 for c in steady)
