"""Report plots: the speedup-vs-gamma plot draws each measured point's bootstrap interval."""

from __future__ import annotations

import pytest

from specfamily.eval import plots
from specfamily.eval.summary import SummaryRow

NAN = float("nan")


def _row(gamma, speedup, low, high):
    return SummaryRow(run=str(gamma), dataset="set", sampling="greedy", drafter="small_model", gamma=gamma, status="ok",
                      prompts=8, new_tokens=80, tau=2.0, alpha=0.7, draft_acceptance=0.6, c=0.1,
                      draft_tokens_per_pass=gamma, seconds=1.0, tokens_per_second=80.0, speedup=speedup,
                      verify_cost=1.2, predicted_speedup=1.3, lossy=False, speedup_low=low, speedup_high=high)


def test_speedup_plot_has_an_error_bar_per_known_interval(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "_save", lambda figure, path: figures.append(figure) or path)
    rows = [_row(2, 1.2, 1.0, 1.5), _row(4, 1.4, NAN, NAN), _row(6, 1.1, 1.12, 1.3)]  # 6: point just outside
    plots.plot_speedup_vs_gamma(rows, lambda g: 1.0 + 0.1 * g, tmp_path / "s.png")
    (bars,) = figures[0].axes[0].containers
    segments = bars.lines[2][0].get_segments()
    drawn = [value for s in segments for value in (s[0][0], s[0][1], s[1][1])]  # x, bottom, top of each bar
    assert drawn == pytest.approx([2, 1.0, 1.5, 6, 1.1, 1.3])  # no bar at gamma 4; clamped at the point for 6
