"""The load report on small fake run folders: each arm's goodput and latency, the concurrency sweep's table of speedup
against batch size with the crossover, and its plot."""

from __future__ import annotations

import math

import pytest

from specfamily.core.metrics import MetricsRecorder
from specfamily.eval.concurrency import PLOT, concurrency_markdown, concurrency_series, series_name
from specfamily.eval.goodput import goodput_markdown, goodput_rows
from specfamily.eval.report import write_report
from specfamily.eval.results import PromptRecord, ResultWriter, RunInfo

# batch size -> arm -> (call wall seconds, call CPU seconds) for 2 requests of 10 new tokens each (one call)
SWEEP = {
    1: {"plain": (2.0, 1.0), "suffix": (1.6, 0.5), "eagle": (2.5, 1.25)},
    2: {"plain": (1.0, 0.5), "suffix": (0.8, 0.4), "eagle": (1.25, 0.4)},
    4: {"plain": (0.5, 0.25), "suffix": (0.625, 0.2), "eagle": (2.0, 0.5)},
}


def _record(arm: str, i: int, batch: int, wall: float, cpu: float, latency: float, ttft: float | None) -> PromptRecord:
    timing = {"size": batch, "arrival_rate": None, "requests": 2, "call_wall_seconds": wall, "call_cpu_seconds": cpu,
              "arrival_s": 0.0, "first_token_s": ttft, "finish_s": latency, "latency_s": latency, "ttft_s": ttft,
              "tokens_per_second": 10 / latency}
    return PromptRecord(drafter=arm, dataset="d", sampling="greedy", prompt_id=f"p{i}", index=i, seed=i,
                        gamma=None, prompt_tokens=5, tokens=list(range(10)), wall_seconds=latency, lossy=False,
                        metrics=_metrics(arm, latency), batch=timing)


def _metrics(arm: str, seconds: float) -> dict:
    """10 new tokens: plain decoding in 10 passes, a drafter in 5 of 2 (1 accepted + the target's token)."""
    recorder = MetricsRecorder()
    for _ in range(10 if arm == "plain" else 5):
        recorder.record_pass(0 if arm == "plain" else 2, 0 if arm == "plain" else 1, 0.0, seconds / 10)
    return recorder.finish(10, seconds).as_dict()


def _run(folder, batch: int, arms: dict[str, tuple[float, float]]) -> None:
    folder.mkdir(parents=True)
    RunInfo(config={"run_label": f"batch_size={batch}", "batch_size": batch, "model": {"target": "t"}}, seed=0,
            dataset="d", sampling="greedy", drafters=list(arms), prompts=2, max_new_tokens=10, world_size=1,
            device="cpu", threads=1, versions={}, git=None, verify_cost={}, started="now").save(folder)
    writer = ResultWriter(folder / "results.jsonl")
    for i, latency, ttft in ((0, 1.0, 0.25), (1, 2.0, None)):
        for arm, (wall, cpu) in arms.items():
            writer.write(_record(arm, i, batch, wall, cpu, latency, ttft))
    writer.close()


@pytest.fixture
def sweep(tmp_path):
    for job, (batch, arms) in enumerate(SWEEP.items()):
        _run(tmp_path / str(job), batch, arms)
    return tmp_path


def test_goodput_rows_and_section(sweep):
    from specfamily.eval.results import read_run

    rows = goodput_rows(read_run(sweep / "0"), "batch_size=1")
    assert [(r.drafter, r.batch_size, r.requests, r.new_tokens, r.seconds, r.goodput, r.speedup) for r in rows] == [
        ("plain", 1, 2, 20, 2.0, 10.0, 1.0), ("suffix", 1, 2, 20, 1.6, 12.5, 1.25), ("eagle", 1, 2, 20, 2.5, 8.0, 0.8)]
    assert [r.cpu_goodput for r in rows] == [20.0, 40.0, 16.0]
    plain = rows[0]
    assert (plain.latency_p50, plain.latency_p90, plain.ttft_p50, plain.request_tps_p50) == (1.5, 1.9, 0.25, 7.5)
    section = goodput_markdown(rows)
    assert "| suffix | 1 | all at once | 2 | 12.5 | 1.25 | 1.50 | 1.90 | 0.25 | 7.5 |" in section


def test_the_sweep_table_has_each_speedup_and_the_crossover(sweep):
    from specfamily.eval.report import collect

    rows = collect(sweep).goodput
    (wall,) = concurrency_series(rows, "wall")
    assert wall.batches == [1, 2, 4] and wall.plain == {1: 10.0, 2: 20.0, 4: 40.0}
    assert wall.speedup == {"suffix": {1: 1.25, 2: 1.25, 4: 0.8}, "eagle": {1: 0.8, 2: 0.8, 4: 0.25}}
    assert (wall.crossover("suffix"), wall.crossover("eagle")) == (4, 1)
    (cpu,) = concurrency_series(rows, "cpu")
    assert cpu.speedup == {"suffix": {1: 2.0, 2: 1.25, 4: 1.25}, "eagle": {1: 0.8, 2: 1.25, 4: 0.5}}
    assert (cpu.crossover("suffix"), cpu.crossover("eagle")) == (None, 1)
    text = concurrency_markdown([wall, cpu])
    assert ("| drafter | B=1 | B=2 | B=4 | crossover |\n| --- | --- | --- | --- | --- |\n"
            "| plain (tok/s) | 10.0 | 20.0 | 40.0 |  |\n| suffix | 1.25x | 1.25x | 0.80x | 4 |\n"
            "| eagle | 0.80x | 0.80x | 0.25x | 1 |\n") in text
    assert "| plain (tok/s) | 20.0 | 40.0 | 80.0 |  |\n| suffix | 2.00x | 1.25x | 1.25x | none up to 4 |\n" in text
    assert text.index("By wall time:") < text.index("By CPU time")


def test_write_report_over_the_sweep_writes_the_section_and_the_plot(sweep):
    report = write_report(sweep)
    text = (sweep / "report.md").read_text()
    assert "## Load: goodput and latency" in text and "## Speedup by load" in text
    assert "| batch_size=4 | suffix | 4 | all at once | 2 | 32.0 | 0.80 |" in text  # the run column: several runs
    assert (sweep / PLOT).is_file() and sweep / PLOT in report.files and f"]({PLOT})" in text
    single = write_report(sweep / "0")  # one run: the goodput section, no sweep
    text = (sweep / "0" / "report.md").read_text()
    assert "## Load: goodput and latency" in text and "## Speedup by load" not in text
    assert not (sweep / "0" / PLOT).exists() and len(single.goodput) == 3


def test_series_and_their_errors(tmp_path):
    assert series_name("batch_size=8") == "" and series_name("arrival_rate=2,batch_size=8") == "arrival_rate=2"
    assert series_name("batch_size=8,drafter.gamma=3") == "drafter.gamma=3"
    _run(tmp_path / "a", 2, SWEEP[2])
    _run(tmp_path / "b", 2, SWEEP[4])  # the same label twice
    from specfamily.eval.report import collect

    with pytest.raises(ValueError, match=r"two runs of series '\(default\)' at batch_size=2"):
        concurrency_series(collect(tmp_path).goodput)
    with pytest.raises(ValueError, match="clock must be one of"):
        concurrency_series([], "gpu")


def test_batch_1_records_have_goodput_by_their_own_seconds_and_no_load_section(sweep):
    records = [_record("plain", i, 1, 0.0, 0.0, 2.0, None) for i in range(2)]
    for record in records:
        record.batch = None  # the runner's batch-1 path
    (row,) = goodput_rows(records, ".")
    assert (row.seconds, row.goodput, row.batch_size) == (4.0, 5.0, 1) and math.isnan(row.cpu_goodput)
    assert goodput_markdown([row]) == ""


def test_every_drafter_of_a_sweep_gets_a_line_of_its_own(tmp_path, monkeypatch):
    """Twelve drafters and more lines than the colour cycle's ten: no two share both colour and line style."""
    from specfamily.eval import plots
    from specfamily.eval.concurrency import Series, plot_speedup_by_batch
    figures = []
    monkeypatch.setattr(plots, "_save", lambda figure, path: figures.append(figure) or path)
    speedup = {f"drafter{i}": {1: 1.0 + i / 100, 2: 0.99} for i in range(13)}
    plot_speedup_by_batch([Series("", "wall", [1, 2], {1: 10.0, 2: 20.0}, speedup)], tmp_path / "p.png")
    drawn = [line for line in figures[0].axes[0].get_lines() if line.get_label() in speedup]
    assert len(drawn) == 13
    assert len({(line.get_color(), line.get_linestyle()) for line in drawn}) == 13
