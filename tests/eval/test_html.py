"""``specfamily-report DIR --html``: one self-contained page, rendered in a real headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from eval_helpers import chat_overrides

from specfamily.core.trace import Trace, token_origins
from specfamily.eval.html import HTML, markdown_html, table_html
from specfamily.eval.report import main
from specfamily.eval.results import PromptRecord, read_records
from specfamily.eval.runner import run_experiment


class _Page(HTMLParser):
    """What a rendered page shows: its report tables (cell texts), answer spans (class, text), hidden answers."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self.spans: list[tuple[str, str]] = []
        self.hidden_texts = 0
        self.shown = ""
        self._table = False
        self._cell: list[str] | None = None
        self._span = False
        self._in_shown = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "table" and "report" in classes:
            self.tables.append([])
            self._table = True
        elif tag == "tr" and self._table:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag == "span" and classes and classes[0].startswith("o-") and "title" in attrs:  # not the legend
            self._span = True
            self.spans.append((classes[0], ""))
        elif tag == "span" and attrs.get("id") == "shown":
            self._in_shown = True
        elif tag == "div" and "text" in classes and "hidden" in attrs:
            self.hidden_texts += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "span":
            self._span = self._in_shown = False
        elif tag == "table":
            self._table = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._span:
            cls, text = self.spans[-1]
            self.spans[-1] = (cls, text + data)
        if self._in_shown:
            self.shown += data


def _parse(dom: str) -> _Page:
    page = _Page()
    page.feed(dom)
    return page


def _markdown_tables(text: str) -> list[list[list[str]]]:
    """Every table of report.md as rows of cells (the separator line left out)."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            if not set(line.replace("|", "").strip()) <= {"-", " "}:
                current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            current = None
    return tables


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def _render(browser: str, page: Path, fragment: str = "", screenshot: Path | None = None) -> str:
    """The DOM after the page's script ran (or a screenshot), from Chromium headless."""
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", f"--user-data-dir={page.parent / '.chromium'}", "--virtual-time-budget=3000"]
    action = [f"--screenshot={screenshot}", "--window-size=1280,2000"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*flags, *action, page.as_uri() + fragment], capture_output=True, text=True, timeout=120,
                          check=True)
    return done.stdout


@pytest.fixture
def traced_run(chat_pair, compose_config, tmp_path) -> Path:
    """A real run: plain decoding, small_model (its draft model is the target: every draft accepted) and
    prompt_lookup, on two questions in two categories (one with a second turn), with plots."""
    overrides = chat_overrides(chat_pair, "drafter.names=[small_model,prompt_lookup]", "plots=true",
                               "dataset.max_new_tokens=16")
    run_experiment(compose_config(overrides), tmp_path)
    return tmp_path


def test_records_carry_the_pass_trace_and_token_pieces(traced_run):
    records = [r for r in read_records(traced_run / "results.jsonl") if isinstance(r, PromptRecord)]
    assert {r.drafter for r in records} == {"plain", "small_model", "prompt_lookup"} and len(records) == 9
    for record in records:
        trace = Trace.from_dict(record.trace)
        assert len(trace) == record.metrics["target_passes"]
        replay = [t for tokens, accepted, bonus, kept in zip(trace.draft_tokens, trace.accepted, trace.bonus,
                                                             trace.kept, strict=True)
                  for t in [*(tokens[i] for i in accepted), bonus][:kept]]
        assert replay == record.tokens
        assert "".join(record.pieces) == record.text and len(record.pieces) == len(record.tokens)
        assert record.metrics["time_to_first_token"] > 0 and record.metrics["peak_memory_bytes"] > 0
    small = [r for r in records if r.drafter == "small_model"]
    assert any(max(token_origins(Trace.from_dict(r.trace))) >= 2 for r in small)  # drafted and accepted deep
    report = (traced_run / "report.md").read_text()
    assert "## Latency and memory" in report


def test_trace_false_leaves_the_passes_out(chat_pair, compose_config, tmp_path):
    overrides = chat_overrides(chat_pair, "trace=false", "dataset.max_turns=1")
    run_experiment(compose_config(overrides), tmp_path)
    records = [r for r in read_records(tmp_path / "results.jsonl") if isinstance(r, PromptRecord)]
    assert records and all(r.trace is None and r.pieces is None for r in records)
    # latency after the first token is measured without the trace, wherever a request took a pass after its first:
    # one whose first pass kept all its tokens (a prompt pass with a draft the policy made long enough) has none
    timed = [r for r in records if r.metrics["target_passes"] > 1]
    assert timed and all(r.metrics["token_latency_p50"] is not None for r in timed)
    assert all(r.metrics["token_latency_p50"] is None for r in records if r.metrics["target_passes"] == 1)


def test_html_renders_in_chromium_with_report_md_numbers(traced_run, capsys):
    browser = _chromium()
    assert main([str(traced_run), "--html"]) == 0
    page = traced_run / HTML
    assert f"wrote {page}" in capsys.readouterr().out
    source = page.read_text()
    assert "http://" not in source and "https://" not in source and "<link" not in source  # self-contained
    assert source.count("data:image/png;base64,") == 3  # the report's three plots, inline

    dom = _parse(_render(browser, page))
    expected = _markdown_tables((traced_run / "report.md").read_text())
    assert len(expected) >= 4  # comparison, latency, by category, by turn
    assert dom.tables == expected  # every number the page shows in its report tables is report.md's
    records = [r for r in read_records(traced_run / "results.jsonl") if isinstance(r, PromptRecord)]
    assert dom.shown == f"showing {len(records)} of {len(records)} answers"  # the script ran
    coloured = [cls for cls, _ in dom.spans]
    assert "o-d1" in coloured and "o-b" in coloured and "o-t" in coloured
    assert "".join(text for _, text in dom.spans) == "".join(r.text for r in records)

    filtered = _parse(_render(browser, page, "#drafter=small_model&category=qa"))
    wanted = [r for r in records if r.drafter == "small_model" and r.category == "qa"]
    assert filtered.shown == f"showing {len(wanted)} of {len(records)} answers" and len(wanted) == 1
    assert filtered.hidden_texts == len(records) - 1

    shot = traced_run / "shot.png"
    _render(browser, page, screenshot=shot)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] >= 1000 and pixels.std() > 0.01  # a page was drawn, not a blank window


def test_markdown_tables_become_filterable_rows():
    html = table_html(["| drafter | tau |", "| --- | --- |", "| plain | 1.00 |", "| eagle | 2.50 |"])
    assert '<tr data-drafter="eagle"><td>eagle</td><td>2.50</td></tr>' in html
    by_category = table_html(["| category | prompts |", "| --- | --- |", "| qa <b> | 3 |"])
    assert '<tr data-category="qa &lt;b&gt;"><td>qa &lt;b&gt;</td><td>3</td></tr>' in by_category


def test_markdown_subset(tmp_path):
    html = markdown_html("# title\n- a `x` **b**\n> warn\n\ntext\n![plot](missing.png)\n", tmp_path)
    assert "<h2>title</h2>" in html and "<li>a <code>x</code> <b>b</b></li>" in html
    assert "<blockquote>warn</blockquote>" in html and "<p>text</p>" in html and "missing.png not found" in html
