"""The recycling drafter (Token Recycling): template, table, tree growth, greedy identity, losslessness."""

import numpy as np
import pytest
import torch

import specfamily as sf
from specfamily.core.plugins import get_registry
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.recycling.config import RecyclingConfig
from specfamily.drafters.recycling.drafter import RecyclingDrafter
from specfamily.drafters.recycling.scored import grow_scored
from specfamily.drafters.recycling.table import AdjacencyTable, joined_rows, top_k
from specfamily.drafters.recycling.template import TEMPLATES, grow, make_template, rank_paths
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, tiny_target


def test_registered_with_its_config_and_defaults():
    assert get_registry().entry("recycling").config is RecyclingConfig
    target = tiny_target("llama", vocab_size=16)
    drafter = sf.create_drafter("recycling", target)
    assert isinstance(drafter, RecyclingDrafter) and drafter.policy.__class__.__name__ == "AutoPolicy"
    assert drafter.template is None and drafter.default_gamma == 6  # scored: best first, at most the reference's depth
    assert (drafter.config.template, drafter.config.max_tree_size, drafter.config.threshold) == ("scored", 8, 0.35)


def test_the_reference_template_has_80_nodes_six_deep_and_every_prefix_is_a_tree():
    paths = rank_paths(TEMPLATES["2.2.2"])
    assert len(paths) == 80 and max(map(len, paths)) == 6 and max(p[-1] for p in paths) == 7
    full = make_template("2.2.2")
    assert len(full) == 80 and full.depth == 6
    assert all(parent < i for i, parent in enumerate(full.parents))
    cut = make_template("2.2.2", max_tree_size=5)
    # by depth + summed rank: rank 0, rank 1, rank 0 under rank 0, rank 2, rank 1 under rank 0
    assert (cut.parents, cut.ranks, cut.depths) == ((-1, -1, 0, -1, 0), (0, 1, 0, 2, 1), (1, 1, 2, 1, 2))


def test_a_template_wider_than_top_k_is_refused():
    with pytest.raises(ValueError, match="template '2.2.2' uses successor rank 7; it needs top_k >= 8, got 4"):
        make_template("2.2.2", top_k=4)
    assert make_template("2.2.2", max_tree_size=5, top_k=3).ranks == (0, 1, 0, 2, 1)


def test_grow_follows_the_table_merges_equal_siblings_and_skips_unknown_rows():
    successors = np.array([[1, 2, 3], [2, 2, 0], [0, 1, 3], [1, 1, 1]])  # row 1: ranks 0 and 1 are both 2
    known = np.array([True, True, True, False])
    template = make_template("2.2.2", max_tree_size=7, top_k=3)
    assert template.parents == (-1, -1, 0, -1, 0, 1, 2) and template.ranks == (0, 1, 0, 2, 1, 0, 0)
    tokens, parents = grow(0, successors, known, template, gamma=3)
    # [0] -> 1, [1] -> 2, [0,0] -> 1's rank 0 = 2, [2] -> 3, [0,1] -> 1's rank 1 = 2 again: merged into [0,0],
    # [1,0] -> 2's rank 0 = 0, [0,0,0] -> (1, 2)'s rank 0 = 0
    assert tokens == [1, 2, 2, 3, 0, 0] and parents == [-1, -1, 0, -1, 1, 2]
    successors[3] = [2, 2, 2]  # an unknown row proposes nothing, whatever it holds
    assert grow(0, successors, known, template, gamma=3) == (tokens, parents)
    shallow, _ = grow(0, successors, known, template, gamma=1)
    assert shallow == [1, 2, 3]
    assert grow(3, successors, known, template, gamma=3) == ([], [])  # an unknown root proposes nothing
    assert grow(0, successors, known, template, gamma=3, stop={1, 2, 3})[0] == [1, 2, 3]  # nothing after a stop


def test_table_update_keeps_each_fed_tokens_top_k_the_last_write_winning():
    table = AdjacencyTable.empty(6, 2)
    logits = torch.tensor([[0.0, 5, 4, 0, 0, 0], [9, 0, 0, 0, 0, 8], [0, 0, 0, 7, 6, 0]])
    table.update([4, 1, 4], logits)
    assert table.successors[1].tolist() == [0, 5] and table.successors[4].tolist() == [3, 4]
    assert table.known.tolist() == [False, True, False, False, True, False]
    with pytest.raises(ValueError, match="2 tokens but 3 rows of logits"):
        table.update([1, 2], logits)


@pytest.mark.parametrize("vocab", [49152, 4096, 1000])
def test_the_two_stage_top_k_is_torch_s(vocab):
    """Random rows (no ties), rows whose top k sit in one block, and a vocabulary not a multiple of 64 (one stage)."""
    torch.manual_seed(0)
    rows = torch.randn(6, vocab)
    rows[1, 128:136] += 50.0  # the whole top 8 in one block
    rows[2, ::64] += 50.0  # one of the top 8 in each of many blocks
    values, indices = top_k(rows, 8)
    top = torch.topk(rows, 8, dim=-1)
    assert torch.equal(values, top.values) and torch.equal(indices, top.indices)
    assert indices[1].tolist() == torch.topk(rows[1, 128:136], 8).indices.add(128).tolist()


def test_deferred_rows_are_written_as_updates_would_be_and_only_the_latest_passes_are_kept():
    from specfamily.drafters.recycling.table import PENDING_PASSES
    torch.manual_seed(1)
    passes = [([i % 5, 5 + i % 3], torch.randn(2, 64)) for i in range(PENDING_PASSES + 2)]
    now, later = AdjacencyTable.empty(64, 4), AdjacencyTable.empty(64, 4)
    for tokens, logits in passes[2:]:
        now.update(tokens, logits)
    for tokens, logits in passes:
        later.defer(tokens, logits)
    assert not later.known.any() and len(later.pending) == PENDING_PASSES  # the two oldest dropped
    later.flush()
    assert not later.pending and np.array_equal(now.successors, later.successors)
    assert np.array_equal(now.scores, later.scores) and np.array_equal(now.known, later.known)
    later.defer([9], torch.randn(1, 64))
    later.update([10], torch.randn(1, 64))  # an update writes what waits first
    assert later.known[9] and later.known[10] and not later.pending
    with pytest.raises(ValueError, match="1 tokens but 2 rows of logits"):
        later.defer([1], torch.randn(2, 64))


def test_observe_learns_from_every_drafted_row_and_a_second_request_is_drafted_deeper():
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = RecyclingDrafter(target, gamma=3, max_tree_size=12, template="2.2.2")
    plain = sf.generate(target, None, prompt, max_new_tokens=40).tokens
    first = sf.generate(target, drafter, prompt, max_new_tokens=40)
    second = sf.generate(target, drafter, prompt, max_new_tokens=40)
    assert first.tokens == plain and second.tokens == plain
    assert second.metrics.mean_accepted_length > first.metrics.mean_accepted_length
    assert second.metrics.mean_accepted_length > 2.5  # the table now holds this text's successors
    fresh = RecyclingDrafter(target, gamma=3, max_tree_size=12, keep=False, template="2.2.2")
    sf.generate(target, fresh, prompt, max_new_tokens=40)
    again = sf.generate(target, fresh, prompt, max_new_tokens=40)
    assert again.metrics.mean_accepted_length == first.metrics.mean_accepted_length  # keep=False: starts empty


def test_observe_without_a_proposal_updates_the_root_row_only():
    target = tiny_target("llama", vocab_size=16)
    drafter = RecyclingDrafter(target, gamma=2)
    from specfamily.core.context import DecodeContext
    ctx = DecodeContext(target, torch.tensor([1, 2]), sf.SamplingConfig(), torch.Generator(), tokens=[1, 2])
    drafter.begin(ctx)
    logits = torch.arange(16.0)[None]
    drafter.observe(VerifyOutcome([7], [], 0, logits=logits))
    assert drafter.table.known.nonzero()[0].tolist() == [2]
    assert drafter.table.successors[2].tolist() == list(range(15, 7, -1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, "top_k must be an integer >= 1, got 0"),
        ({"template": "9.9"}, "template must be one of 2.2.2, scored, got '9.9'"),
        ({"threshold": 1.0}, r"threshold must be a number in \[0, 1\), got 1.0"),
        ({"max_tree_size": 0}, "max_tree_size must be an integer >= 1, got 0"),
        ({"keep": "yes"}, "keep must be true or false, got 'yes'"),
        ({"gamma": 0}, "gamma must be an integer >= 1, got 0"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        RecyclingConfig(**options)


def test_greedy_equals_transformers_with_trees_proposed():
    reports = assert_greedy_equivalent(lambda t: RecyclingDrafter(t, gamma=3, max_tree_size=12,
                                                                  template="2.2.2"))
    assert all(report.drafted_passes > 0 for report in reports)


@pytest.mark.parametrize("sampling", SAMPLING_MATRIX, ids=["t1", "t07-top_p09", "top_k5"])
def test_lossless_at_depth_two(sampling):
    [fit] = assert_lossless(lambda t: RecyclingDrafter(t, gamma=3, max_tree_size=12, template="2.2.2"),
                            configs=[sampling],
                            min_depth=2)
    assert fit.passed


def test_table_keeps_the_probabilities_of_its_successors():
    table = AdjacencyTable.empty(4, 2)
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3, 0.0]]))
    table.update([2], logits)
    assert table.successors[2].tolist() == [1, 2]
    np.testing.assert_allclose(table.scores[2], [0.6, 0.3], rtol=1e-6)
    assert table.scores[0].tolist() == [0.0, 0.0]


def test_grow_scored_keeps_the_most_likely_paths_above_the_threshold_parents_first():
    successors = np.array([[1, 2], [2, 0], [0, 1], [1, 2]])
    scores = np.array([[0.7, 0.2], [0.9, 0.1], [0.5, 0.4], [0.9, 0.1]], dtype=np.float32)
    known = np.array([True, True, True, False])
    # from 0: 1 (.7), 1->2 (.63), 1->2->0 (.315), 2 (.2), 1->2->1 (.252), 1->0 (.07), ...
    tokens, parents = grow_scored(0, successors, scores, known, size=4, gamma=3, threshold=0.0)
    assert tokens == [1, 2, 0, 1] and parents == [-1, 0, 1, 1]
    tokens, parents = grow_scored(0, successors, scores, known, size=8, gamma=3, threshold=0.25)
    assert tokens == [1, 2, 0, 1] and parents == [-1, 0, 1, 1]  # .2 and below left out
    assert grow_scored(0, successors, scores, known, size=8, gamma=1, threshold=0.0) == ([1, 2], [-1, -1])
    assert grow_scored(0, successors, scores, known, size=8, gamma=3, threshold=0.8) == ([], [])  # unsure: nothing
    assert grow_scored(3, successors, scores, known, size=8, gamma=3, threshold=0.0) == ([], [])  # unknown root
    assert grow_scored(0, successors, scores, known, size=8, gamma=3, threshold=0.0, stop={1, 2}) == ([1, 2], [-1, -1])


def test_scored_drafter_is_greedy_identical_and_drafts_from_the_recycled_probabilities():
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = RecyclingDrafter(target, gamma=3, template="scored", max_tree_size=12, threshold=0.01)
    assert drafter.template is None and drafter.default_gamma == 6  # the depth cap without a gamma
    plain = sf.generate(target, None, prompt, max_new_tokens=40).tokens
    first = sf.generate(target, drafter, prompt, max_new_tokens=40)
    second = sf.generate(target, drafter, prompt, max_new_tokens=40)
    assert first.tokens == plain and second.tokens == plain
    assert second.metrics.mean_accepted_length > first.metrics.mean_accepted_length > 1.0
    never = RecyclingDrafter(target, gamma=3, template="scored", threshold=0.999)
    assert sf.generate(target, never, prompt, max_new_tokens=20).metrics.mean_accepted_length == 1.0


def test_scored_greedy_equals_transformers_with_trees_proposed():
    reports = assert_greedy_equivalent(lambda t: RecyclingDrafter(t, gamma=3, template="scored", max_tree_size=12,
                                                                  threshold=0.0))
    assert all(report.drafted_passes > 0 for report in reports)


@pytest.mark.parametrize("sampling", SAMPLING_MATRIX, ids=["t1", "t07-top_p09", "top_k5"])
def test_scored_lossless_at_depth_two(sampling):
    [fit] = assert_lossless(lambda t: RecyclingDrafter(t, gamma=3, template="scored", max_tree_size=12, threshold=0.0),
                            configs=[sampling], min_depth=2)
    assert fit.passed


def test_observe_learns_the_rows_of_a_cut_draft_it_was_told_of():
    """The batched loop may feed a deterministic proposal cut to its first levels (``batch_lengths.truncated``):
    the outcome names the fed draft's tokens, and the rows rewritten are the root's and those tokens'."""
    from specfamily.core.batch_lengths import truncated
    from specfamily.core.context import DecodeContext
    target = tiny_target("llama", vocab_size=16)
    drafter = RecyclingDrafter(target, gamma=3, template="scored", max_tree_size=8)
    ctx = DecodeContext(target, torch.tensor([1, 2]), sf.SamplingConfig(), torch.Generator(), tokens=[1, 2])
    drafter.begin(ctx)
    drafter.table.update([2, 5, 6], torch.eye(16)[[5, 6, 7]] * 9)  # 2 -> 5 -> 6 -> 7: a three-deep chain
    proposed = drafter.propose(ctx, 3)
    assert proposed.tokens.tolist()[:3] == [5, 6, 7] and int(proposed.depths().max()) == 3
    fed = truncated(proposed, 1)
    logits = torch.arange(16.0).repeat(len(fed) + 1, 1)
    drafter.observe(VerifyOutcome([5, 9], [0], len(fed), logits=logits, drafted=fed.tokens))
    assert drafter.table.successors[5].tolist() == list(range(15, 7, -1))  # the fed node's row rewritten
    assert drafter.table.successors[6].tolist()[0] == 7  # an unfed node's row left as it was


def test_batched_with_drafts_cut_by_the_plan_keeps_the_plain_text(monkeypatch):
    """A batched run whose plan cuts every tree to one level (lookahead): each slot's text is its plain batched text
    and the drafter learned from the cut drafts' rows (it used to be told of none and refuse the logits)."""
    from specfamily.core import batch_loop
    from specfamily.core.batch_lengths import LengthPolicy
    from specfamily.core.batch_plan import BatchPlanning
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float32)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8], [1, 4, 1, 4, 2, 1], [5, 5, 3, 5]]
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=24)]
    learn, lengths, cut = batch_loop._Batch._learn, BatchPlanning._lengths, []

    def always_lookahead(self, group, drafts, seconds):  # the tiny target's pass is too fast to judge proposals cheap
        learn(self, group, drafts, seconds)
        self.lookahead = True

    def one_level(self, group, prospects, proposed=False):  # planned as ever, then drafted: seen drafts at one level
        lengths(self, group, prospects, proposed)
        cut.append(proposed and any(len(p.rows) > 1 for p in prospects))
        return [1 if len(p.rows) else 0 for p in prospects] if proposed else [len(p.rows) for p in prospects]

    def always_proposing(self, prospects, together=False, contexts=None):  # the pre-check: every pass proposes
        return [1] * len(prospects), 1.0, "pays"

    monkeypatch.setattr(batch_loop._Batch, "_learn", always_lookahead)
    monkeypatch.setattr(BatchPlanning, "_lengths", one_level)
    monkeypatch.setattr(LengthPolicy, "decision", always_proposing)
    drafter = RecyclingDrafter(target, gamma=3, policy="auto", max_tree_size=12, template="2.2.2")
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=24, max_batch=2)
    assert [r.tokens for r in results] == plain
    assert any(cut)  # a deeper proposal was cut to one level


def test_a_batch_scores_every_slot_s_rows_in_one_call_and_learns_what_its_slots_learn_one_by_one(monkeypatch):
    """Each batched observation (every slot's root and fed nodes, drafted trees among them) leaves the slots' one
    table as their own ``observe`` calls in slot order would, with one top-k over the pass's rows (on a pass no slot
    drafted for, once the table is read); the texts are the plain batched texts."""
    import copy

    from specfamily.core.batch_slots import slot_copy
    target = tiny_target("llama", vocab_size=256, spread=1.0, dtype=torch.float32)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8], [1, 4, 1, 4, 2, 1], [5, 5, 3, 5]]
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=20)]
    batched, scored, checked = RecyclingDrafter.observe_batch, AdjacencyTable.scored, []
    calls, views = [], []

    def counted(self, logits):
        calls.append(logits.shape[0])
        return scored(self, logits)

    def twinned(self, drafters, outcomes):
        twins, table = [slot_copy(d, target) for d in drafters], copy.deepcopy(drafters[0].table)
        assert all(d.table is drafters[0].table for d in drafters)  # batch_shared: one table for every slot
        for twin in twins:
            twin.table = table  # the twins share a copy of it
        for twin, outcome in zip(twins, outcomes, strict=True):
            twin.observe(outcome)
        before, idle = len(calls), not any(d._fed for d in drafters) and len(drafters) > 1
        batched(self, drafters, outcomes)
        assert len(drafters[0].table.pending) == idle  # a pass no slot drafted for is scored when next read
        if idle:  # its rows kept as a view of the pass's own logits where the slots' rows are consecutive in it
            views.append(drafters[0].table.pending[-1][1].data_ptr() == outcomes[0].logits.data_ptr())
        drafters[0].table.flush()
        assert len(calls) == before + 1 and calls[-1] == sum(o.draft_size + 1 for o in outcomes)  # every row at once
        for drafter, twin in zip(drafters, twins, strict=True):
            assert np.array_equal(drafter.table.successors, twin.table.successors)
            assert np.array_equal(drafter.table.scores, twin.table.scores)
            assert np.array_equal(drafter.table.known, twin.table.known)
        checked.append((len(drafters), sum(o.draft_size for o in outcomes)))

    from specfamily.core.batch_plan import BatchPlanning
    own, passes = BatchPlanning._prefill_gammas, []

    def every_third_idle(self, group):  # every third pass asks no slot for a draft: its rows wait
        passes.append(len(passes) % 3 != 2)
        return own(self, group) if passes[-1] else [0] * len(group)

    monkeypatch.setattr(BatchPlanning, "_prefill_gammas", every_third_idle)
    monkeypatch.setattr(AdjacencyTable, "scored", counted)
    monkeypatch.setattr(RecyclingDrafter, "observe_batch", twinned)
    drafter = RecyclingDrafter(target, gamma=3, max_tree_size=8, template="2.2.2")
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=20, max_batch=3)
    assert [r.tokens for r in results] == plain
    assert max(slots for slots, _ in checked) == 3 and sum(nodes for _, nodes in checked) > 0
    assert passes.count(False) >= 3 and any(views)


def test_joined_rows_is_a_view_of_one_tensor_s_consecutive_rows_and_a_copy_otherwise():
    rows = torch.randn(7, 16)
    parts = [rows[0:2], rows[2:3], rows[3:6]]
    joined = joined_rows(parts)
    assert torch.equal(joined, rows[:6]) and joined.data_ptr() == rows.data_ptr()
    for apart in ([rows[0:2], rows[3:5]], [rows[2:4], rows[0:2]], [rows[0:2], torch.randn(3, 16)],
                  [rows[0:2], rows[2:4, :8]]):  # a gap, out of order, another tensor, another width
        if apart[0].shape[1] == apart[1].shape[1]:
            assert torch.equal(joined_rows(apart), torch.cat(apart))
        else:
            with pytest.raises(RuntimeError):
                joined_rows(apart)
    assert joined_rows([rows[1:3]]).data_ptr() == rows[1:3].data_ptr()


def test_rows_waiting_in_any_slot_s_table_are_written_before_a_pass_s_newer_rows():
    """Slots with tables of their own (keep=False), one still holding deferred rows: a drafted pass writes them
    first, so the newer row of a token fed again is the one kept."""
    from specfamily.core.context import DecodeContext
    target = tiny_target("llama", vocab_size=16)
    a, b = (RecyclingDrafter(target, gamma=2, keep=False) for _ in range(2))
    for drafter in (a, b):
        drafter.begin(DecodeContext(target, torch.tensor([1, 7]), sf.SamplingConfig(), torch.Generator(),
                                    tokens=[1, 7]))
    b.table.defer([7], torch.eye(16)[[3]] * 9)  # older: 7 -> 3
    a._fed = [7]  # a was asked this pass (it proposed nothing)
    newer = torch.eye(16)[[5]] * 9  # this pass: 7 -> 5
    a.observe_batch([a, b], [VerifyOutcome([2], [], 0, logits=newer, drafted=torch.tensor([], dtype=torch.long)),
                             VerifyOutcome([2], [], 0, logits=newer, drafted=torch.tensor([], dtype=torch.long))])
    b.table.flush()
    assert not b.table.pending and b.table.successors[7][0] == 5


def test_scored_rows_reach_the_host_in_one_copy():
    """On stand-ins for an accelerator's tensors: the successors and their probabilities in one wait, not two."""
    from specfamily.testing.syncs import SyncCounter, on_device

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    table = AdjacencyTable.empty(40, 4)
    with SyncCounter() as syncs:
        successors, scores = table.scored(on_device(logits))
    assert syncs.count == 1, syncs
    expected, indices = torch.softmax(logits, dim=-1).topk(4, dim=-1)
    assert successors.tolist() == indices.tolist() and np.allclose(scores, expected.numpy(), atol=1e-6)
