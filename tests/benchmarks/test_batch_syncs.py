"""benchmarks/batch_syncs.py: each drafter's host waits a batched pass on a stand-in model, at two batch sizes."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def batch_syncs(benchmark_module):
    return benchmark_module("batch_syncs")


def test_the_table_counts_each_drafters_waits_a_pass_at_each_batch_size(batch_syncs, capsys, tmp_path):
    out = tmp_path / "syncs.json"
    assert batch_syncs.main(["--batches", "2,4", "--requests", "4", "--new-tokens", "6", "--drafters",
                             "plain,prompt_lookup", "--json", str(out)]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.startswith("| p")}
    assert set(rows) == {"plain", "prompt_lookup"}
    counts = json.loads(out.read_text())
    plain = {c["batch"]: c for c in counts if c["drafter"] == "plain"}
    assert all(c["error"] is None and c["passes"] > 0 for c in counts)
    # plain decoding: one wait a pass at either batch size (the verdicts), besides each request's admission (its
    # prompt to the device, its tokens back); what a pass sends the device is queued, not a wait
    assert {site.split(":")[0] for site in plain[4]["sites"]} == {"host.py", "target.py", "batch_requests.py"}
    assert plain[4]["request_passes"] > plain[4]["passes"]  # several requests a pass
    assert sum(n for s, n in plain[4]["sites"].items() if s.startswith("host.py")) == plain[4]["passes"], plain[4]


def test_a_drafter_the_counter_cannot_follow_is_a_row_with_its_error_and_an_unknown_name_a_usage_error(
        batch_syncs, capsys):
    def broken(target):
        raise RuntimeError("made outside the view")

    count = batch_syncs.count("broken", broken, [[1, 2, 3], [4, 5]], 2, 4)
    assert count.error == "RuntimeError: made outside the view" and count.per_pass == "-"
    assert "not counted: RuntimeError: made outside the view" in batch_syncs.row([count])
    with pytest.raises(SystemExit):
        batch_syncs.main(["--drafters", "nope"])
    assert "unknown drafters ['nope']" in capsys.readouterr().err
