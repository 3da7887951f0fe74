"""``specfamily-report DIR --html``: one self-contained HTML file to look at a run (or a sweep).

``report.html`` holds, with its stylesheet, script and plots inline (PNG as base64; nothing is fetched):

- the whole of ``report.md`` (header, tables, notes, plots), converted line by line, so every number it shows is the
  string ``report.md`` shows;
- per drafter, the per-position acceptance (cumulative, and where the depth was tried) as numbers and bars, and how
  its tokens came about (accepted at depth d, bonus, target; from the pass traces);
- every prompt turn with each drafter's answer coloured token by token by origin (:mod:`specfamily.eval.html_text`);
- filters by drafter and by category (also from the address: ``report.html#drafter=NAME&category=NAME``).
"""

from __future__ import annotations

import base64
import math
import re
from html import escape
from pathlib import Path

from specfamily.core.trace import BONUS, TARGET
from specfamily.eval.html_assets import CSS, JS
from specfamily.eval.html_text import MAX_SHADE, OriginCounts, origin_class, origin_counts, prompt_sections
from specfamily.eval.results import PromptRecord
from specfamily.eval.summary import SummaryRow

HTML = "report.html"
_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)]+)\)$")
_CODE = re.compile(r"`([^`]*)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_BLOCKS = ("|", "#", "- ", "> ", "![")


def _inline(text: str) -> str:
    """Escaped text with Markdown's `code` and **bold** kept."""
    return _BOLD.sub(r"<b>\1</b>", _CODE.sub(r"<code>\1</code>", escape(text)))


def split_row(line: str) -> list[str]:
    """The cells of a Markdown table line ``| a | b |``."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_html(lines: list[str]) -> str:
    """A Markdown table as an HTML table; rows carry data-drafter / data-category when a column says so."""
    header, body = split_row(lines[0]), [split_row(line) for line in lines[2:]]
    drafter = header.index("drafter") if "drafter" in header else None
    category = 0 if header[0] == "category" else None
    rows = []
    for cells in body:
        attrs = "" if drafter is None else f' data-drafter="{escape(cells[drafter], quote=True)}"'
        attrs += "" if category is None else f' data-category="{escape(cells[category], quote=True)}"'
        rows.append(f"<tr{attrs}>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = "<tr>" + "".join(f"<th>{escape(c)}</th>" for c in header) + "</tr>"
    return f'<table class="report"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _image(folder: Path, alt: str, src: str) -> str:
    path = folder / src
    if not path.is_file():
        return f"<p>[{escape(alt)}: {escape(src)} not found]</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{escape(alt, quote=True)}" src="data:image/png;base64,{data}">'


def markdown_html(text: str, folder: Path) -> str:
    """The Markdown subset ``report.md`` uses: headings, tables, lists, quotes, paragraphs and plot images."""
    out, lines, i = [], text.splitlines(), 0
    images: list[str] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(table_html(lines[i:j]))
            i = j
            continue
        image = _IMAGE.match(line.strip())
        if image:
            images.append(_image(folder, image["alt"], image["src"]))
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<li>{_inline(line[2:])}</li>")
        elif line.startswith("> "):
            out.append(f"<blockquote>{_inline(line[2:])}</blockquote>")
        elif line.strip():  # a paragraph: this line and the plain lines after it
            j = i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].startswith(_BLOCKS):
                j += 1
            out.append(f"<p>{_inline(' '.join(lines[i:j]))}</p>")
            i = j
            continue
        i += 1
    if images:
        out.append('<div class="plots">' + "".join(images) + "</div>")
    return "\n".join(out)


def _number(value: float) -> str:
    return f"{value:.2f}" if value is not None and math.isfinite(value) else "-"


def per_position_html(rows: list[SummaryRow]) -> str:
    """Each drafter's per-position acceptance: cumulative P(accepted length > i), and where depth i + 1 was tried."""
    drafted = [r for r in rows if r.per_position]
    if not drafted:
        return "<p>No drafter drafted: no per-position acceptance.</p>"
    depth = max(len(r.per_position) for r in drafted)
    head = "".join(f"<th>{d}</th>" for d in range(1, depth + 1))
    body = []
    for row in drafted:
        label = escape(row.drafter + ("" if row.run == "." else f" [{row.run}]"))
        for kind, values in (("cumulative", row.per_position), ("where tried", row.conditional)):
            cells = "".join(_bar_cell(values[d] if d < len(values) else float("nan")) for d in range(depth))
            body.append(f'<tr data-drafter="{escape(row.drafter, quote=True)}"><td>{label}</td><td>{kind}</td>'
                        f"{cells}</tr>")
    return (f'<table id="per-position"><thead><tr><th>drafter</th><th>acceptance</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _bar_cell(value: float) -> str:
    if not math.isfinite(value):
        return "<td>-</td>"
    return f'<td><span class="bar" style="width:{round(value * 40)}px"></span>{value:.2f}</td>'


def origins_html(counts: list[OriginCounts]) -> str:
    """Per drafter, the share of its tokens accepted at each depth, bonus tokens and the target's own."""
    if not counts:
        return "<p>No record has a pass trace (run with <code>trace: true</code>).</p>"
    depth = max((o for c in counts for o in c.counts if o > 0), default=0)
    origins = [*range(1, depth + 1), BONUS, TARGET]
    names = [f"depth {d}" for d in range(1, depth + 1)] + ["bonus", "target"]
    head = "".join(f'<th class="{origin_class(o)}">{n}</th>' for o, n in zip(origins, names, strict=True))
    body = "".join(f'<tr data-drafter="{escape(c.drafter, quote=True)}"><td>{escape(c.drafter)}</td>'
                   f"<td>{c.total}</td>" + "".join(f"<td>{c.share(o):.1%}</td>" for o in origins) + "</tr>"
                   for c in counts)
    return (f'<table id="origins"><thead><tr><th>drafter</th><th>tokens</th>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _legend() -> str:
    depths = "".join(f'<span class="o-d{d}">depth {d}{"+" if d == MAX_SHADE else ""}</span>'
                     for d in range(1, MAX_SHADE + 1))
    return (f'<p class="legend">accepted at {depths} <span class="o-b">bonus</span> '
            '<span class="o-t">target</span></p>')


def _select(ident: str, label: str, values: list[str]) -> str:
    options = "".join(f'<option value="{escape(v, quote=True)}">{escape(v)}</option>' for v in values)
    return f'<label>{label} <select id="{ident}"><option value="">all</option>{options}</select></label>'


def render_html(report_md: str, folder: Path, rows: list[SummaryRow],
                records: list[tuple[str | None, PromptRecord]]) -> str:
    """The page: filters, the report, per-position acceptance, token origins, every answer coloured."""
    prompts = [record for _, record in records]
    drafters = list(dict.fromkeys(r.drafter for r in prompts))
    categories = sorted({r.category for r in prompts if r.category})
    filters = (f'<div class="filters">{_select("filter-drafter", "drafter", drafters)} '
               f'{_select("filter-category", "category", categories)} <span id="shown"></span>{_legend()}</div>')
    body = [filters, '<div id="report">', markdown_html(report_md, folder), "</div>",
            "<h2>Per-position acceptance</h2>", per_position_html(rows),
            "<h2>Where the tokens came from</h2>", origins_html(origin_counts(prompts)),
            '<h2>Answers</h2><div id="answers">', prompt_sections(records), "</div>"]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>specfamily report</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + f"\n<script>{JS}</script></body></html>\n")
