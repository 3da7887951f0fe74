"""The batched decode loop: every request's greedy text equals its batch-1 text, continuous batching, budgets."""

import logging

import pytest
import torch
from batch_clock import priced_run
from flawed_oracle import FlawedOracle

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.arrivals import LoopClock
from specfamily.core.batch_lengths import LengthPolicy
from specfamily.core.types import Draft
from specfamily.testing import OracleDrafter, RandomTreeDrafter, tiny_model, tiny_target


def _prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts of ragged lengths 2, 5, 8, ..."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (2 + 3 * (i % 5),), generator=gen).tolist() for i in range(count)]


def _hf_greedy(target, prompt, n):
    ids = torch.tensor([prompt])
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_plain_batched_decoding_equals_transformers_greedy_per_request(family, attn):
    target = tiny_target(family, vocab_size=64, spread=1.0, dtype=torch.float32, attn=attn)
    prompts = _prompts(64, 5)
    results = sf.generate_batch(target, None, prompts, max_new_tokens=12)
    assert [r.tokens for r in results] == [_hf_greedy(target, p, 12) for p in prompts]
    assert [r.metrics.target_passes for r in results] == [12] * 5


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("max_batch", [2, 3, None])
def test_random_trees_in_a_batch_equal_batch_1(family, max_batch):
    """Ragged trees (random shapes and sizes per request) and ragged caches; with max_batch < 7 requests wait and are
    admitted as others retire (ragged budgets retire them at different passes)."""
    target = tiny_target(family, vocab_size=64, spread=1.0, dtype=torch.float32)
    drafter = RandomTreeDrafter(target, gamma=3, nodes=6)
    prompts = _prompts(64, 7, seed=1)
    reference = [sf.generate(target, drafter, p, max_new_tokens=20, seed=i).tokens for i, p in enumerate(prompts)]
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=20, max_batch=max_batch)
    assert [r.tokens for r in results] == reference
    assert all(r.metrics.draft_steps > 0 for r in results)  # the requests did draft


def test_continuous_batching_admits_as_requests_retire(monkeypatch):
    """With max_batch=2 the batch never holds more than 2 and a waiting request is admitted in the pass after one
    retires (here both retire together: the third is prefilled alone)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    widths = []
    forward = batch_loop.BatchTarget.forward

    def spy(self, lo, feeds, features=False):
        widths.append((lo, len(feeds), [feed.pending.numel() for feed in feeds]))
        return forward(self, lo, feeds, features)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", spy)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    oracle = OracleDrafter(target, gamma=4)
    results = sf.generate_batch(target, oracle, prompts, max_new_tokens=9, max_batch=2)
    assert [r.tokens for r in results] == [_hf_greedy(target, p, 9) for p in prompts]
    assert max(n for _, n, _ in widths) == 2
    assert widths[0] == (0, 2, [3, 2])  # both first requests prefilled together
    admitted = [w for w in widths if w[2] == [4]]
    assert len(admitted) == 1 and admitted[0][:2] == (0, 1)  # the third, alone, into the freed slot 0


class Uneven(FlawedOracle):
    """FlawedOracle's drafts, every token wrong for a prompt that starts at token 40 or above: requests that advance
    a token a pass beside requests that advance up to four."""

    def propose(self, ctx, gamma):
        draft = super().propose(ctx, gamma)
        if int(ctx.tokens[0]) < 40:
            return draft
        return Draft.chain([(t + 1) % 64 for t in draft.tokens.tolist()])


def test_a_newcomer_is_prefilled_beside_the_other_requests_roots_and_a_last_wave_is_admitted_together(monkeypatch):
    """max_batch 2, 6 requests whose drafts are accepted to different depths (the second's never), so requests
    retire at different passes. While more requests wait than there are slots, each newcomer is admitted as
    its slot frees and its prompt fed in the pass that decodes the other slot's root (no live slot waits a pass for a
    prefill; such a pass drafts nothing under draft length by load). In the last wave (2 waiting for 2 slots) the
    freed slot is held until the other frees, and both newcomers are prefilled in one pass, as plain decoding's are.
    Greedy texts (priced_run checks them against generate)."""
    passes, admitted = [], []
    admit = batch_loop._Batch._admit

    def admitting(self, index, ids, arrival):
        admitted.append((len(passes), index, len(self.live)))
        return admit(self, index, ids, arrival)

    monkeypatch.setattr(batch_loop._Batch, "_admit", admitting)
    drafter_of = lambda target: Uneven(target, gamma=4, policy="auto", horizon=96)  # noqa: E731
    priced_run(monkeypatch, lambda b, n: 1.0, drafter_of, [0.0] * 6, passes=passes, max_batch=2, max_new_tokens=24)
    prefills = [(at, n) for at, (n, _, steady) in enumerate(passes) if not steady]
    assert all(n == 2 for _, n in prefills) and not any(any(g) for n, g, steady in passes if not steady)
    by_pass = {}
    for at, index, live in admitted:
        by_pass.setdefault(at, []).append((index, live))
    assert by_pass[0] == [(0, 0), (1, 1)]
    singles = [at for at, joined in by_pass.items() if at and len(joined) == 1]
    assert [by_pass[at][0][0] for at in singles] == [2, 3]  # the third and fourth, each alone
    assert all(by_pass[at][0][1] == 1 for at in singles)  # beside a live request's root
    last = max(by_pass)
    assert [index for index, _ in by_pass[last]] == [4, 5] and by_pass[last][0][1] == 0  # the last wave, together
    assert len(prefills) == len(by_pass)  # one prefill pass per admission time


def test_eos_inside_an_accepted_block_ends_only_that_request():
    model = tiny_model("llama", vocab_size=16, spread=1.0, dtype=torch.float32)
    target = sf.load_target(model)
    prompts = [[1, 2], [3, 4, 5], [6]]
    plain = [sf.generate(target, None, p, max_new_tokens=30).tokens for p in prompts]
    eos = plain[0][3]  # a token the first request emits early
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    target = sf.load_target(model)
    reference = [sf.generate(target, OracleDrafter(target, gamma=5), p, max_new_tokens=30).tokens for p in prompts]
    results = sf.generate_batch(target, OracleDrafter(target, gamma=5), prompts, max_new_tokens=30)
    assert [r.tokens for r in results] == reference
    assert results[0].tokens[-1] == eos and len(results[0].tokens) <= 4


def test_sampled_requests_draw_from_their_own_generators():
    """Request i draws from seed + i: a request's sampled text does not depend on which others share its batch."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    sampling = sf.SamplingConfig(temperature=1.0)
    drafter = RandomTreeDrafter(target, gamma=3, nodes=5, sampled=True)
    prompts = _prompts(64, 4, seed=2)
    together = sf.generate_batch(target, drafter, prompts, max_new_tokens=10, sampling=sampling, seed=7)
    alone = sf.generate_batch(target, drafter, prompts[2:3], max_new_tokens=10, sampling=sampling, seed=9)
    assert together[2].tokens == alone[0].tokens
    assert len({tuple(r.tokens) for r in together}) > 1


def test_batch_of_one_and_max_batch_one_are_generate():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = _prompts(64, 3)
    sequential = sf.generate_batch(target, None, prompts, max_new_tokens=6, max_batch=1)
    assert [r.tokens for r in sequential] == [sf.generate(target, None, p, max_new_tokens=6).tokens for p in prompts]
    assert sf.generate_batch(target, None, [], max_new_tokens=6) == []
    assert [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=0)] == [[], [], []]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"max_batch": 0}, ValueError, "max_batch must be an int >= 1, got 0"),
    ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be >= 0, got -1"),
    ({"prompts": torch.tensor([[1, 2]])}, TypeError, "prompts must be a list of token-id sequences, got Tensor"),
    ({"prompts": [[1, 2], []]}, ValueError, "prompt is empty"),
    ({"prompts": [[1, 99]]}, ValueError, r"token id 99 is outside the vocabulary \[0, 64\)"),
])
def test_bad_input_is_refused_with_its_reason(kwargs, error, message):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    call = {"prompts": [[1, 2], [3]], **kwargs}
    with pytest.raises(error, match=message):
        sf.generate_batch(target, None, call.pop("prompts"), **call)


class FakeClock:
    """A clock that moves only when the loop sleeps or a target pass advances it (``per_pass`` seconds)."""

    def __init__(self) -> None:
        self.t, self.sleeps = 100.0, []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def _timed_passes(monkeypatch, clock: FakeClock, per_pass: float) -> list[tuple[float, int, list[int]]]:
    """Make every batched target pass take ``per_pass`` seconds on ``clock``; record (start, lo, fed per slot)."""
    passes = []
    forward = batch_loop.BatchTarget.forward

    def timed(self, lo, feeds, features=False):
        passes.append((clock.t - 100.0, lo, [feed.pending.numel() for feed in feeds]))
        clock.t += per_pass
        return forward(self, lo, feeds, features)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", timed)
    return passes


def test_requests_are_admitted_when_they_arrive_and_the_loop_waits_for_them(monkeypatch):
    """Arrivals 0, 5, 1 (not sorted), passes of 0.5 s, 4 tokens each: request 0 runs alone until 1.0, request 2 joins
    (its prompt prefilled in the pass that decodes request 0's root), both finish, the loop sleeps until 5.0 for
    request 1."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    clock = FakeClock()
    passes = _timed_passes(monkeypatch, clock, 0.5)
    prompts = _prompts(64, 3)
    results = sf.generate_batch(target, None, prompts, max_new_tokens=4, arrivals=[0.0, 5.0, 1.0],
                                clock=LoopClock(clock.now, clock.sleep))
    assert [r.tokens for r in results] == [_hf_greedy(target, p, 4) for p in prompts]
    assert passes == [(0.0, 0, [2]), (0.5, 0, [1]), (1.0, 0, [1, 8]), (1.5, 0, [1, 1]), (2.0, 0, [1]),
                      (2.5, 0, [1]), (5.0, 0, [5]), (5.5, 0, [1]), (6.0, 0, [1]), (6.5, 0, [1])]
    assert clock.sleeps == [pytest.approx(2.0)]  # from 3.0, when request 2 finished, to request 1's arrival
    timing = [(r.metrics.arrival_s, r.metrics.first_token_s, r.metrics.finish_s) for r in results]
    assert timing == [(0.0, 0.5, 2.0), (5.0, 5.5, 7.0), (1.0, 1.5, 3.0)]
    assert results[2].metrics.time_to_first_token == 0.5  # from its admission, as generate counts from its start
    assert results[2].metrics.total_seconds == 2.0


def test_a_full_batch_queues_arrived_requests_and_their_latency_counts_the_wait(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    clock = FakeClock()
    _timed_passes(monkeypatch, clock, 1.0)
    results = sf.generate_batch(target, None, _prompts(64, 3), max_new_tokens=2, max_batch=2,
                                arrivals=[0.0, 0.0, 0.5], clock=LoopClock(clock.now, clock.sleep))
    timing = [(r.metrics.arrival_s, r.metrics.first_token_s, r.metrics.finish_s) for r in results]
    assert timing == [(0.0, 1.0, 2.0), (0.0, 1.0, 2.0), (0.5, 3.0, 4.0)]  # request 2 waited for a free slot
    assert clock.sleeps == []


def test_one_by_one_waits_for_each_arrival_and_is_generate():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    clock = FakeClock()
    prompts = _prompts(64, 2)
    results = sf.generate_batch(target, None, prompts, max_new_tokens=3, max_batch=1, arrivals=[2.0, 0.5],
                                clock=LoopClock(clock.now, clock.sleep))
    assert [r.tokens for r in results] == [sf.generate(target, None, p, max_new_tokens=3).tokens for p in prompts]
    assert clock.sleeps == [0.5, 1.5]  # request 1 first, at 0.5; request 0 at 2.0
    assert [r.metrics.arrival_s for r in results] == [2.0, 0.5]
    assert [r.metrics.finish_s for r in results] == [2.0, 0.5]  # the fake clock does not move inside generate


@pytest.mark.parametrize(("arrivals", "error", "message"), [
    ([0.0], ValueError, "arrivals has 1 entries for 2 prompts"),
    ([0.0, -1.0], ValueError, r"arrivals\[1\] must be a finite number of seconds >= 0, got -1.0"),
    ([float("nan"), 0.0], ValueError, r"arrivals\[0\] must be a finite number of seconds >= 0, got nan"),
    ([0.0, float("inf")], ValueError, r"arrivals\[1\] must be a finite number of seconds >= 0, got inf"),
    ([0.0, "1"], TypeError, r"arrivals\[1\] must be a number of seconds, got str"),
    ([True, 0.0], TypeError, r"arrivals\[0\] must be a number of seconds, got bool"),
    ("01", TypeError, "arrivals must be a sequence of seconds, got str"),
])
def test_bad_arrivals_are_refused_with_their_reason(arrivals, error, message):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    with pytest.raises(error, match=message):
        sf.generate_batch(target, None, [[1, 2], [3]], arrivals=arrivals)


def test_arrivals_do_not_change_the_text_of_any_request():
    target = tiny_target("gpt2", vocab_size=64, spread=1.0, dtype=torch.float32)
    drafter = RandomTreeDrafter(target, gamma=3, nodes=6)
    prompts = _prompts(64, 5, seed=3)
    clock = FakeClock()
    at_once = sf.generate_batch(target, drafter, prompts, max_new_tokens=12, max_batch=3)
    spread = sf.generate_batch(target, drafter, prompts, max_new_tokens=12, max_batch=3,
                               arrivals=[3.0, 0.0, 1.0, 1.0, 0.5], clock=LoopClock(clock.now, clock.sleep))
    assert [r.tokens for r in spread] == [r.tokens for r in at_once]
    assert len(clock.sleeps) >= 1  # the fake clock only moves when the loop waits: every arrival was waited for


@pytest.mark.parametrize("max_batch", [2, None])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_a_batched_request_traces_the_passes_its_batch_1_run_makes(max_batch, kind):
    """At temperature 0 each request's trace (drafts, accepted paths, bonus tokens, kept counts) is its batch-1 trace;
    times are the batch pass's, one per pass, non-decreasing."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    tree = RandomTreeDrafter(target, gamma=3, nodes=6)
    drafter = FlawedOracle(target, gamma=3, horizon=32) if kind == "chain" else tree
    prompts = _prompts(64, 4, seed=4)
    alone = [sf.generate(target, drafter, p, max_new_tokens=14, seed=i).trace for i, p in enumerate(prompts)]
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=14, max_batch=max_batch, trace=True)
    columns = ("draft_tokens", "parents", "accepted", "bonus", "kept")
    for result, reference in zip(results, alone, strict=True):
        assert {c: getattr(result.trace, c) for c in columns} == {c: getattr(reference, c) for c in columns}
        assert len(result.trace) == result.metrics.target_passes > 1
        assert result.trace.end_seconds == sorted(result.trace.end_seconds)
        assert result.metrics.time_to_first_token == result.trace.end_seconds[0]
    if kind == "chain":  # its passes accepted every length, none to all
        assert sorted({len(a) for r in results for a in r.trace.accepted[1:]}) == [0, 1, 2, 3]
    else:  # every pass after the prefill verified a whole tree, but a last one the budget left no room to draft in
        assert {len(tokens) for r in results for tokens in r.trace.draft_tokens[1:]} == {0, 6}
    untraced = sf.generate_batch(target, drafter, prompts, max_new_tokens=14, max_batch=max_batch, trace=False)
    assert [r.trace for r in untraced] == [None] * 4
    assert [r.tokens for r in untraced] == [r.tokens for r in results]


def test_plain_batched_decoding_under_the_stream_kernel_is_each_requests_generate_text():
    """The fast path of plain batched decoding (the lean forward multiplying by the batch-invariant stream kernel)
    gives each request what ``generate`` gives it under the same kind, with ragged prompts and continuous batching."""
    from specfamily.runtime import kernel

    if not kernel.stream_kernel().available:
        pytest.skip(f"stream kernel unavailable: {kernel.stream_kernel().reason}")
    target = sf.load_target(tiny_model("llama", vocab_size=64, spread=1.0, dtype=torch.float32), matmul="stream")
    assert target.matmul == "stream" and target.lean is not None and target.lean.ready()
    prompts = _prompts(64, 6, seed=5)
    alone = [sf.generate(target, None, p, max_new_tokens=10).tokens for p in prompts]
    for max_batch in (None, 4):
        results = sf.generate_batch(target, None, prompts, max_new_tokens=10, max_batch=max_batch)
        assert [r.tokens for r in results] == alone


def test_a_compiled_pass_target_warns_once_that_its_batched_passes_run_eagerly(caplog):
    """compile="pass" compiles batch-1 passes; the batched ones run the eager lean forward: one warning per target
    says so, and each request's greedy text is the one a Target without compile gives it."""
    model = tiny_model("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    compiled, eager = sf.load_target(model, compile="pass"), sf.load_target(model)
    assert compiled.compiled_pass is not None and compiled.compiled_pass.active
    prompts = _prompts(64, 4, seed=3)
    with caplog.at_level(logging.WARNING, logger="specfamily.core.batch_loop"):
        first = sf.generate_batch(compiled, None, prompts, max_new_tokens=8)
        again = sf.generate_batch(compiled, None, prompts, max_new_tokens=8, max_batch=2)
        sf.generate_batch(eager, None, prompts, max_new_tokens=8)
    notes = [r.getMessage() for r in caplog.records if r.name == "specfamily.core.batch_loop"]
    assert notes == [batch_loop.COMPILED_PASS_NOTE]
    expected = [r.tokens for r in sf.generate_batch(eager, None, prompts, max_new_tokens=8)]
    assert [r.tokens for r in first] == [r.tokens for r in again] == expected
    assert compiled.compiled_pass.calls == 0  # no batched pass went through the graph


def test_draft_length_by_load_measures_no_batch_1_cost_curve(monkeypatch):
    """Under draft length by load the batch plans from the row costs its own passes time: the first run in a process
    measures no batch-1 verify-cost curve (seconds inside its clock), and its greedy text is plain decoding's; a curve
    batch 1 measured on the target is lent to the slots' policies as it is."""
    from specfamily.core import costs
    from specfamily.core.policy import AutoPolicy

    model = tiny_model("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    target = sf.load_target(model)
    prompts = _prompts(64, 4, seed=4)
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=12)]

    def refused(*args, **kwargs):
        raise AssertionError("a verify-cost curve was measured")

    monkeypatch.setattr(costs, "measure_pass_seconds", refused)
    results = sf.generate_batch(target, OracleDrafter(target, gamma=3, policy="auto"), prompts, max_new_tokens=12)
    assert [r.tokens for r in results] == plain
    assert target.verify_costs is None and [r.metrics.calibration_seconds for r in results] == [0.0] * 4
    target.verify_costs = {0: 1.0, 4: 3.0}  # as batch 1 would have left it
    bound = []
    monkeypatch.setattr(AutoPolicy, "bind", lambda self, curve: bound.append(curve(2.0)), raising=True)
    sf.generate_batch(target, OracleDrafter(target, gamma=3, policy="auto"), prompts, max_new_tokens=12)
    assert bound == [2.0] * 4



def test_a_lookahead_pass_whose_proposals_are_all_empty_is_not_valued_nor_planned(monkeypatch):
    """Under lookahead (prompt lookup proposing at full depth first), a pass on which no slot's proposal found
    anything is not valued (``_worth``) nor planned on prospects: its plan could only be no draft. Every other
    lookahead pass is valued once, and every request's text is its plain batched text."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8, 9], [10, 11, 12, 10, 11, 12], [20, 21, 22]]
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=16)]
    learn, valued, propose = batch_loop._Batch._learn, batch_loop._Batch._worth, batch_loop._Batch._propose
    counts = {"empty": 0, "found": 0, "valued": 0}

    def always_lookahead(self, group, drafts, seconds):  # the tiny target's pass is too fast to judge proposals cheap
        learn(self, group, drafts, seconds)
        self.lookahead = True

    def proposing(self, group, gammas):
        drafts, seconds = propose(self, group, gammas)
        if self.lookahead and all(r.prefilled for r in group) and any(gammas):
            counts["found" if any(len(d) for d in drafts) else "empty"] += 1
        return drafts, seconds

    def counted(self, group, prospects, proposed, contexts):
        counts["valued"] += self.lookahead is True  # (before lookahead is learned the lengths are planned ahead)
        return valued(self, group, prospects, proposed, contexts)

    def always_proposing(self, prospects, together=False, contexts=None):  # the pre-check: every pass proposes
        counts["checked"] = counts.get("checked", 0) + 1
        return [1] * len(prospects), 1.0, "pays"

    monkeypatch.setattr(batch_loop._Batch, "_learn", always_lookahead)
    monkeypatch.setattr(batch_loop._Batch, "_propose", proposing)
    monkeypatch.setattr(batch_loop._Batch, "_worth", counted)
    monkeypatch.setattr(LengthPolicy, "decision", always_proposing)
    drafter = sf.create_drafter("prompt_lookup", target)
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=16)
    assert [r.tokens for r in results] == plain
    assert counts["empty"] > 0 and counts["found"] > 0  # both kinds of lookahead pass ran
    assert counts["valued"] == counts["found"] + counts["checked"]  # the pre-check values each pass's chains once
