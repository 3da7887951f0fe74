"""benchmarks/suffix.py's plumbing on a tiny random target: interleaved arms, identity checks, warm caches, rows."""

from __future__ import annotations

import pytest
import torch

from specfamily.testing import tiny_target


@pytest.fixture
def bench(benchmark_module):
    return benchmark_module("suffix")


def _items(bench, count=3):
    gen = torch.Generator().manual_seed(0)
    items = []
    for i in range(count):
        base = torch.randint(0, 32, (4,), generator=gen).tolist()
        items.append(bench.Item("ab"[i % 2], base * 3))
    return items


def test_arms_are_interleaved_identical_and_summarised(bench):
    target = tiny_target("llama", vocab_size=32)
    arms = {name: bench.make_drafter(target, name, 4) for name in ("plain", "prompt_lookup", "suffix", "suffix:chain")}
    assert arms["suffix"].config.max_tree_size == 4 and arms["suffix:chain"].config.mode == "chain"
    results = bench.run_workload(target, arms, _items(bench), max_new_tokens=12)
    rows = bench.summary_rows(results)
    assert [(r["arm"], r["category"]) for r in rows[:3]] == [("plain", "all"), ("plain", "a"), ("plain", "b")]
    assert all(r["identical"] for r in rows) and all(r["tokens"] == 36 for r in rows if r["category"] == "all")
    plain, suffix = rows[0], next(r for r in rows if r["arm"] == "suffix" and r["category"] == "all")
    assert plain["tau"] == 1.0 and plain["speedup"] == 1.0 and plain["proposed"] == 0
    assert suffix["proposed"] > 0 and suffix["tau"] > 1.0
    assert "| suffix | all |" in bench.markdown("t", rows)
    memory = bench.cache_memory(arms["suffix"])
    assert memory["tokens"] == 36 and memory["states"] > 0
    assert 0 < memory["mb_per_1k_tokens"] < memory["trie_mb_per_1k_tokens"]


def test_same_size_rows_replay_every_arm_from_plain_outputs(bench):
    """The teacher-forced rows: each arm at each size, per category; at size 4 the replayed tau of prompt lookup
    equals a real run's at gamma 4 over the same prompts (one drafter object over them, as in the report)."""
    import specfamily as sf

    target = tiny_target("llama", vocab_size=32)
    items = _items(bench)
    results = bench.run_workload(target, {"plain": None, "prompt_lookup": bench.make_drafter(target,
                                                                                              "prompt_lookup", 4)},
                                 items, max_new_tokens=12)
    outputs = bench.plain_outputs(target, items, {tuple(items[0].ids): results[0].outputs[0]}, 12)
    assert outputs == results[0].outputs  # the known one reused, the others decoded
    rows = bench.same_size_rows(target, items, outputs, 0.01, 12, [2, 4])
    assert {(r["gamma"], r["arm"]) for r in rows} == {(g, a) for g in (2, 4)
                                                     for a in ("prompt_lookup", "suffix", "suffix (paper)")}
    assert {r["category"] for r in rows} == {"all", "a", "b"}
    replayed = next(r for r in rows if (r["gamma"], r["arm"], r["category"]) == (4, "prompt_lookup", "all"))
    assert replayed["tau"] == pytest.approx(results[1].total.tau)
    assert all(r["proposal_share_of_pass"] >= 0 for r in rows)
    text = bench.same_size_markdown(rows)
    assert "| a |" in text and "suffix (paper) @4" in text
    drafter = sf.create_drafter("suffix", target, gamma=4)
    assert drafter.config.max_spec_offset is None  # the replay's suffix arm is the drafter at its defaults


def test_warm_cache_is_saved_and_loaded(bench, tmp_path):
    target = tiny_target("llama", vocab_size=32)
    items = _items(bench, 2)
    path = bench.warm_cache(target, items, 8, tmp_path / "warm.safetensors", 3)
    warm = bench.make_drafter(target, "suffix", 3, {"cache": str(path)})
    assert warm.global_cache.tokens == 16
    with pytest.raises(ValueError, match="first arm must be plain"):
        bench.run_workload(target, {"suffix": warm}, items, 4)


# --- the teacher-forced replay (benchmarks/suffix_replay.py) ---------------------------------------


@pytest.fixture
def replay(benchmark_module):
    return benchmark_module("suffix_replay")


@pytest.mark.parametrize(("name", "options"), [("prompt_lookup", {}), ("suffix", {}), ("suffix", {"mode": "chain"}),
                                               ("suffix", {"max_spec_offset": 3.0})])
def test_replay_gives_a_real_runs_passes_exactly(replay, tmp_path, name, options):
    """Two prompts, one drafter object each way (suffix's global cache carries from the first to the second): the
    replay's tokens and passes per prompt are the real run's, and the greedy continuations come back from the file."""
    import specfamily as sf

    target = tiny_target("llama", vocab_size=24)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [7, 8, 1, 2, 3, 9, 7, 8, 1, 2]]
    path = tmp_path / "greedy.json"
    greedy = replay.greedy_continuations(target, "tiny", prompts, 30, path)
    assert replay.greedy_continuations(None, "tiny", prompts, 30, path) == greedy  # no target needed: from the file
    real_drafter, replayed_drafter = (sf.create_drafter(name, target, gamma=4, **options) for _ in range(2))
    real, passes = [], []
    for prompt, expected in zip(prompts, greedy, strict=True):
        result = sf.generate(target, real_drafter, prompt, max_new_tokens=30)
        assert result.tokens == expected
        real.append((result.metrics.new_tokens, result.metrics.target_passes))
        replayed = replay.replay(replayed_drafter, target, prompt, expected, 30)
        passes.append((replayed.tokens, replayed.passes))
    assert passes == real
    assert sum(p for _, p in real) < sum(t for t, _ in real)  # drafts were accepted: tau > 1


def test_accepted_path_is_the_longest_matching_path_plus_the_bonus_token(replay):
    from specfamily.core.types import Draft

    tree = Draft(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 1, 2, 1]))  # 5 | 6 -> 7 -> 8 | 6 -> 9
    assert replay.accepted_path(tree, [0, 0, 6, 7, 3], 2) == ([1, 2], 3)
    assert replay.accepted_path(tree, [6, 9, 4], 0) == ([1, 4], 4)
    assert replay.accepted_path(tree, [6, 7, 8], 0) == ([1, 2, 3], -1)  # past the greedy text: nothing to add
    assert replay.accepted_path(Draft.empty(), [4], 0) == ([], 4)
