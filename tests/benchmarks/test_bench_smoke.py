"""The benchmark scripts' plumbing on tiny random models: pairs, identity checks, skips, reports (no timing claims)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from specfamily.testing import tiny_model, tiny_target
from specfamily.testing.tiny import single_thread

VOCAB = 64


@pytest.fixture
def bench(benchmark_module):
    """The scripts' modules (common, peer, overhead), imported from benchmarks/ and forgotten afterwards."""
    names = ("pairs", "bench_report", "common", "peer_setup", "peer_rows", "ceiling", "peer", "overhead", "defaults")
    return argparse.Namespace(**{name: benchmark_module(name) for name in names})


@pytest.fixture(scope="module")
def pair():
    """A tiny float32 Llama target (no EOS: every run has its full length) and a one-layer draft, on one thread
    (more only add overhead on models this small), with a given verify-cost curve (the cost-aware policy would
    otherwise time the target's passes first)."""
    target = tiny_target("llama", vocab_size=VOCAB, spread=1.0, dtype=torch.float32)
    target.verify_costs = {0: 1.0, 16: 1.2}
    draft = tiny_model("llama", VOCAB, seed=7, dtype=torch.float32, spread=1.0, layers=1)
    with single_thread():
        yield target, draft


def _prompts(count: int = 2, length: int = 12) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (length,), generator=gen).tolist() for _ in range(count)]


def test_peer_rows_are_identical(bench, pair, tmp_path):
    target, draft = pair
    args = bench.peer.parse_args(["--tokens", "8", "--repeats", "1", "--threads", "1", "--oracle-gamma", "3",
                                  "--lookup-gamma", "3", "--only", "plain,small_model,prompt_lookup,oracle"])
    report = bench.peer.measure(bench.peer.make_setup(target, draft, _prompts(), args))
    names = [row["name"] for row in report["rows"]]
    assert names[0] == "plain" and names[-1] == "oracle gamma=3"
    assert {"small_model gamma=", "prompt_lookup gamma="} <= {name[: name.index("=") + 1] for name in names[1:-1]}
    assert "small_model" in report["calibration"]  # gamma was swept, not given
    assert all(row["identical"] for row in report["rows"]), report["markdown"]
    oracle = report["rows"][-1]
    assert oracle["tau"] == 4.0  # alpha = 1: 8 tokens in two passes of gamma + 1 = 4
    assert report["oracle"]["ceiling_steady_state"] > 0 and report["oracle"]["efficiency"] > 0
    assert "| plain | plain generate |" in report["markdown"]
    out = bench.common.write_json(tmp_path / "peer.json", report)
    assert json.loads(out.read_text())["rows"][0]["name"] == "plain"


NO_EAGLE3 = "no --eagle3-weights, and the zoo has no EAGLE-3 for this target"


def test_medusa_and_eagle_rows_cover_tree_and_chain_modes(bench, pair):
    target, _ = pair
    args = bench.peer.parse_args(["--tokens", "8", "--repeats", "1", "--threads", "1", "--only", "medusa,eagle",
                                  "--option", "medusa.weights=random", "--option", "eagle.weights=random"])
    report = bench.peer.measure(bench.peer.make_setup(target, None, _prompts(), args))
    assert [row["name"] for row in report["rows"]] == ["medusa tree", "medusa chain", "eagle tree", "eagle chain"]
    assert all(row["identical"] for row in report["rows"]), report["markdown"]
    assert report["skipped"] == [{"name": "small_model", "reason": "no --draft model"},
                                 {"name": "eagle3", "reason": NO_EAGLE3}]


def test_eagle3_rows_run_with_the_weights_given_and_are_skipped_without(bench, pair, tmp_path):
    from specfamily.drafters.eagle.drafter import Eagle3Drafter
    from specfamily.drafters.eagle.formats3 import save_eagle3

    target, _ = pair
    model = Eagle3Drafter(target, weights="random", layers=[0, 1, 2], draft_vocab=list(range(0, VOCAB, 2)), seed=3)
    weights = save_eagle3(model.model, tmp_path / "eagle3", target, layout="speculators")
    base = ["--tokens", "8", "--repeats", "1", "--threads", "1", "--only", "eagle3"]
    args = bench.peer.parse_args([*base, "--eagle3-weights", str(weights)])
    assert args.eagle3_weights == str(weights)
    report = bench.peer.measure(bench.peer.make_setup(target, None, _prompts(), args))
    assert [row["name"] for row in report["rows"]] == ["eagle3 tree", "eagle3 chain"]
    assert all(row["identical"] for row in report["rows"]), report["markdown"]
    assert "eagle3" not in {skip["name"] for skip in report["skipped"]}
    setup = bench.peer.make_setup(target, None, _prompts(1), bench.peer.parse_args(base))
    rows, skipped = bench.peer.build_rows(setup, {"calibration": {}})
    assert rows == [] and [(s.name, s.reason) for s in skipped] == [
        ("small_model", "no --draft model"), ("eagle3", NO_EAGLE3)]


def test_every_registered_drafter_gets_a_row_or_a_skip_reason(bench, pair):
    import specfamily as sf

    target, _ = pair
    args = bench.peer.parse_args(["--tokens", "4", "--threads", "1"])
    setup = bench.peer.make_setup(target, None, _prompts(1), args)
    rows, skipped = bench.peer.build_rows(setup, {"calibration": {}})
    assert [name for name, _ in rows][0] == "plain" and rows[-1][0] == "oracle"
    assert skipped and skipped[0].name == "small_model" and skipped[0].reason == "no --draft model"
    assert set(sf.list_drafters()) <= {name for name, _ in rows} | {s.name for s in skipped}


def test_a_mismatch_is_reported_with_its_position(bench, pair):
    target, _ = pair
    common = bench.common
    honest = common.ours_fn(target, None, 6)

    def off_by_one(prompt):
        tokens = common.hf_generate(target.model, prompt, 6)
        return tokens[:3] + [(tokens[3] + 1) % VOCAB] + tokens[4:]

    method = common.Method("plain", common.stateless(honest), off_by_one, "perturbed generate")
    result = common.measure_pair(method, _prompts(1), 1, common.make_clock("wall"))
    assert not result.identical
    assert [(m.prompt, m.position, m.against) for m in result.mismatches] == [(0, 3, "theirs")]
    assert "| NO (1 prompt(s)) |" in common.markdown_table([result])
    assert common.describe_mismatches([result])[0].startswith("MISMATCH plain vs theirs: prompt 0, position 3")


def test_first_mismatch_finds_prefixes(bench):
    first = bench.common.first_mismatch
    assert first([1, 2, 3], [1, 2, 3]) is None
    assert first([1, 2, 3], [1, 5, 3]) == (1, 2, 5)
    assert first([1, 2], [1, 2, 9]) == (2, None, 9)


def test_a_row_that_fails_to_build_is_skipped_with_its_reason(bench, pair, capsys):
    target, draft = pair
    args = bench.peer.parse_args(["--tokens", "4", "--repeats", "1", "--threads", "1"])
    setup = bench.peer.make_setup(target, draft, _prompts(1), args)

    def broken():
        raise FileNotFoundError("zoo model 'zoo:code-medusa' is not shipped")

    skipped = []
    assert bench.peer.measure_rows(setup, [("medusa", broken)], skipped) == []
    assert skipped[0].name == "medusa"
    assert skipped[0].reason == "could not be created: FileNotFoundError: zoo model 'zoo:code-medusa' is not shipped"
    assert "skip medusa: could not be created" in capsys.readouterr().out


def test_overhead_rows_are_identical(bench, pair):
    target, draft = pair
    args = bench.overhead.parse_args(["--tokens", "8", "--repeats", "1", "--threads", "1", "--gamma", "2"])
    report = bench.overhead.measure(target, draft, _prompts(), args)
    names = ["plain", "plain, transformers forward", "bare model loop", "small_model gamma=2"]
    assert [row["name"] for row in report["rows"]] == names
    assert all(row["identical"] for row in report["rows"]), report["markdown"]
    assert set(report["split_ms_per_token"]) == {"plain", "small_model gamma=2"}


def test_load_prompts_reads_ids_and_text_and_refuses_bad_input(bench, tmp_path):
    load = bench.common.load_prompts
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1, 2, 3]}) + "\n\n" + json.dumps({"prompt": "ab"}) + "\n")

    def tokenizer(text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    assert load(path, 5, tokenizer) == [[1, 2, 3], [97, 98]]
    assert load(path, 1, None, max_prompt_tokens=2) == [[2, 3]]
    with pytest.raises(ValueError, match="text prompts need a target with a tokenizer"):
        load(path, 2, None)
    with pytest.raises(ValueError, match="does not exist"):
        load(tmp_path / "missing.jsonl", 1)
    with pytest.raises(ValueError, match="prompt count must be >= 1, got 0"):
        load(path, 0)


def test_option_specs_parse_as_json_or_text(bench):
    parse = bench.peer.drafter_options
    assert parse(["medusa.weights=random", "eagle.gamma=5", 'self_spec.skip=["layer:5"]']) == {
        "medusa": {"weights": "random"}, "eagle": {"gamma": 5}, "self_spec": {"skip": ["layer:5"]}
    }
    with pytest.raises(ValueError, match="--option takes NAME.KEY=VALUE, got 'gamma=3'"):
        parse(["gamma=3"])


def test_json_report_has_no_nan_and_leaves_no_temp_file(bench, tmp_path):
    out = bench.common.write_json(tmp_path / "r.json", {"tau": float("nan"), "rows": [1.5]})
    assert json.loads(out.read_text()) == {"tau": None, "rows": [1.5]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
