"""No timed request of a benchmark is served by a drafter that has seen it: the suffix drafter's global cache (earlier
requests' answers) never holds the answer of the request it serves, in ``defaults.py``'s warm-up and in the peer
benchmark's warm-up and repeats (``pairs.measure_pair``); and the peer benchmark times each drafter row beside our
plain decoding and transformers', prompt by prompt. Tiny random target, a few tokens: the drafter's state and the
call order are checked, never a time."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specfamily.testing import tiny_target
from specfamily.testing.tiny import single_thread

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MODULES = ("pairs", "bench_report", "common", "peer_setup", "peer_rows", "ceiling", "peer", "defaults")
VOCAB = 64
TOKENS = 8


@pytest.fixture
def bench(benchmark_module):
    """The scripts' modules, imported from benchmarks/ and forgotten afterwards (those that exist)."""
    names = [name for name in MODULES if (BENCHMARKS / f"{name}.py").is_file()]
    return argparse.Namespace(**{name: benchmark_module(name) for name in names})


@pytest.fixture(scope="module")
def target():
    """A tiny float32 Llama (no EOS: every answer has its full length), on one thread, with a given verify-cost
    curve (the cost-aware policy would otherwise time the target's passes first)."""
    target = tiny_target("llama", vocab_size=VOCAB, spread=1.0, dtype=torch.float32)
    target.verify_costs = {0: 1.0, 16: 1.2}
    with single_thread():
        yield target


def _prompts(count: int = 3, length: int = 12) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (length,), generator=gen).tolist() for _ in range(count)]


@dataclass
class Call:
    """One ``sf.generate`` call: the drafter object, the prompt, the suffix drafter's cached sequences before the
    call (None for other drafters) and the answer."""

    drafter: object
    prompt: list[int]
    cached: list[list[int]] | None
    answer: list[int]


@pytest.fixture
def calls(monkeypatch) -> list[Call]:
    """Every ``sf.generate`` call from here on, in order (the benchmarks look ``sf.generate`` up at call time)."""
    import specfamily as sf
    from specfamily.drafters.suffix.drafter import SuffixDrafter

    real, seen = sf.generate, []

    def spy(target, drafter, prompt, *args, **kwargs):
        cached = [list(s) for s in drafter.global_cache.sequences] if isinstance(drafter, SuffixDrafter) else None
        result = real(target, drafter, prompt, *args, **kwargs)
        seen.append(Call(drafter, list(prompt), cached, list(result.tokens)))
        return result

    monkeypatch.setattr(sf, "generate", spy)
    return seen


def _suffix_calls(calls: list[Call], prompts: list[list[int]]) -> list[Call]:
    """The suffix drafter's calls, after checking the prompts' answers differ (so an answer names its prompt)."""
    answers = {tuple(c.prompt): tuple(c.answer) for c in calls}
    assert len(set(answers.values())) == len(prompts), "the tiny target answers two prompts alike"
    return [c for c in calls if c.cached is not None]


def _assert_never_seen(served: list[Call]) -> None:
    for call in served:
        assert call.answer not in call.cached, (
            f"prompt {call.prompt} served by a suffix drafter whose global cache already holds its answer")


def test_defaults_times_each_prompt_on_a_drafter_that_has_not_seen_it(bench, target, calls):
    prompts = _prompts()
    bench.defaults.run_set(target, "set", prompts, bench.defaults.make_arms(target, ["suffix"], [1]), TOKENS)
    served = _suffix_calls(calls, prompts)
    assert len(served) == 2 * (1 + len(prompts))  # suffix and suffix@1: a warm-up, then every prompt
    _assert_never_seen(served)
    timed = [c for c in served if c.prompt == prompts[-1]]
    assert all(len(c.cached) == len(prompts) - 1 for c in timed)  # it learnt from the earlier prompts, as intended


def _peer_setup(bench, target, repeats: int, only: str):
    args = bench.peer.parse_args(["--tokens", str(TOKENS), "--repeats", str(repeats), "--threads", "1",
                                  "--draft", "none", "--only", only])
    return bench.peer.make_setup(target, None, _prompts(), args)


def test_peer_warm_up_and_repeats_serve_no_prompt_twice_to_one_drafter(bench, target, calls):
    setup = _peer_setup(bench, target, 2, "suffix")
    report = bench.peer.measure(setup)
    assert [row["name"] for row in report["rows"]] == ["suffix"] and report["rows"][0]["identical"]
    served = _suffix_calls(calls, setup.prompts)
    assert len(served) == 1 + 2 * len(setup.prompts)  # the warm-up, then two repeats over every prompt
    _assert_never_seen(served)


def test_peer_times_each_drafter_row_beside_plain_decoding_prompt_by_prompt(bench, target, calls, monkeypatch):
    setup = _peer_setup(bench, target, 2, "suffix")
    real_hf, hf_side = bench.common.hf_generate, object()

    def hf(model, prompt, *args, **kwargs):  # transformers' calls go into the same log
        tokens = real_hf(model, prompt, *args, **kwargs)
        calls.append(Call(hf_side, list(prompt), None, tokens))
        return tokens

    monkeypatch.setattr(bench.common, "hf_generate", hf)
    report = bench.peer.measure(setup)
    index = {tuple(p): i for i, p in enumerate(setup.prompts)}
    side = lambda c: "hf" if c.drafter is hf_side else "plain" if c.drafter is None else "ours"  # noqa: E731
    groups = [calls[i : i + 3] for i in range(0, len(calls), 3)]
    n = len(setup.prompts)
    assert len(calls) == 3 * (1 + 2 * n)  # the warm-up prompt, then two repeats over every prompt, three sides each
    assert [{index[tuple(c.prompt)] for c in g} for g in groups] == [{0}] + [{i} for _ in range(2) for i in range(n)]
    assert all(sorted(side(c) for c in g) == ["hf", "ours", "plain"] for g in groups)
    row = report["rows"][0]
    assert len(row["plain_ms"]) == 2 and row["speedup_min"] <= row["speedup_median"] <= row["speedup_max"]
    assert report["markdown"].splitlines()[2].startswith(
        "| method | vs | ours ms/token | theirs ms/token | ratio (theirs/ours) | tau | identical? | over our plain |")


def test_measure_pair_builds_our_side_afresh_for_the_warm_up_and_each_repeat(bench):
    pairs = bench.pairs
    built, served = [], []

    def make():
        side = len(built)
        built.append(side)

        def run(prompt):
            served.append((side, prompt[0]))
            return pairs.Output(list(prompt), len(prompt))

        return run

    method = pairs.Method("spy", make, lambda prompt: list(prompt), "echo", plain=lambda p: pairs.Output(p, len(p)))
    result = pairs.measure_pair(method, [[1], [2]], 3, iter(range(1000)).__next__)
    assert built == [0, 1, 2, 3]  # the warm-up's side, then one per repeat
    assert served == [(0, 1), (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert len(result.ratios) == len(result.speedups) == 3 and result.identical
