"""Building the held-out prompt sets from the zoo corpus's held-out files (deterministic, jsonl).

- ``complete.jsonl``: a file up to a function's docstring (or signature), the function's body as the reference.
- ``continue.jsonl``: a window of held-out tokens, the tokens that follow as the reference (with ``prompt_ids``).

Each line holds ``id``, ``prompt``, ``reference``, ``source`` (relative to the corpus root) and token counts.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from specfamily.io.files import write_text_atomically
from specfamily.recipes.corpus import Document
from specfamily.zoo.prompts import evenly


@dataclass(frozen=True)
class PromptSetConfig:
    complete_count: int = 300  # every docstring function, then signature-only ones up to this many
    complete_context: int = 768  # max prompt tokens (whole lines kept, truncated from the left)
    complete_reference: int = 128  # max reference tokens (whole lines where possible)
    continue_count: int = 300
    continue_context: int = 256
    continue_reference: int = 128
    continue_per_file: int = 16  # at most this many windows from one file, evenly spaced


@dataclass(frozen=True)
class FunctionSite:
    """A function whose body follows line ``prompt_end`` (1-based, inclusive) up to ``body_end``."""

    source: str
    name: str
    prompt_end: int
    body_end: int
    has_docstring: bool


# ---------------------------------------------------------------- reading the held-out files


def _count(tokenizer: PreTrainedTokenizerFast, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------- complete: functions


def function_sites(doc: Document) -> list[FunctionSite]:
    """Functions with a multi-line body that continues past the docstring / signature."""
    try:
        tree = ast.parse(doc.text)
    except (SyntaxError, ValueError):
        return []
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.body[0].lineno == node.lineno:
            continue
        has_doc = ast.get_docstring(node, clean=False) is not None
        if has_doc and len(node.body) == 1:
            continue  # nothing after the docstring
        prompt_end = node.body[0].end_lineno if has_doc else node.body[0].lineno - 1
        sites.append(FunctionSite(doc.path, node.name, prompt_end, node.end_lineno, has_doc))
    return sorted(sites, key=lambda s: s.prompt_end)


def _largest_fitting(count: int, fits) -> int:
    """The largest k in [0, count] with fits(k) true, given fits is monotone (true then false)."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def complete_row(site: FunctionSite, lines: Sequence[str], tokenizer, cfg: PromptSetConfig) -> dict | None:
    """One ``complete`` row; the prompt ends without its newline, the reference starts with it."""
    head = lines[: site.prompt_end]
    drop = len(head) - _largest_fitting(
        len(head), lambda k: _count(tokenizer, "".join(head[len(head) - k :]).rstrip("\n")) <= cfg.complete_context
    )
    prompt = "".join(head[drop:]).rstrip("\n")
    if not prompt.strip():
        return None
    newline = "".join(head)[len("".join(head).rstrip("\n")) :]
    body = lines[site.prompt_end : site.body_end]
    keep = _largest_fitting(
        len(body), lambda k: _count(tokenizer, newline + "".join(body[:k])) <= cfg.complete_reference
    )
    if keep:
        reference = (newline + "".join(body[:keep])).rstrip("\n")
    else:  # a single overlong line: cut by tokens
        ids = tokenizer(newline + "".join(body), add_special_tokens=False)["input_ids"][: cfg.complete_reference]
        reference = tokenizer.decode(ids)
    if not reference.strip():
        return None
    return {
        "prompt": prompt,
        "reference": reference,
        "source": site.source,
        "function": site.name,
        "line": site.prompt_end,
        "has_docstring": site.has_docstring,
        "n_prompt_tokens": _count(tokenizer, prompt),
        "n_reference_tokens": _count(tokenizer, reference),
    }


def build_complete(docs: Sequence[Document], tokenizer, cfg: PromptSetConfig) -> list[dict]:
    """The ``complete`` rows, ordered by file then line."""
    sites = [site for doc in docs for site in function_sites(doc)]
    lines = {doc.path: doc.text.splitlines(keepends=True) for doc in docs}
    rows = []
    with_doc = evenly([s for s in sites if s.has_docstring], cfg.complete_count)  # then signature-only ones
    chosen = set(with_doc) | set(evenly([s for s in sites if not s.has_docstring], cfg.complete_count - len(with_doc)))
    for site in [s for s in sites if s in chosen]:
        row = complete_row(site, lines[site.source], tokenizer, cfg)
        if row is not None:
            rows.append({"id": f"complete-{len(rows):04d}"} | row)
    return rows


# ---------------------------------------------------------------- continue: token windows


def continue_rows_of(doc: Document, tokenizer, cfg: PromptSetConfig) -> Iterator[dict]:
    """Windows of one file whose prompt and reference decode to exact text."""
    ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
    length = cfg.continue_context + cfg.continue_reference
    for start in evenly(list(range(0, len(ids) - length + 1, length)), cfg.continue_per_file):
        prompt_ids = ids[start : start + cfg.continue_context]
        reference_ids = ids[start + cfg.continue_context : start + length]
        prompt, reference = tokenizer.decode(prompt_ids), tokenizer.decode(reference_ids)
        if prompt + reference != tokenizer.decode(prompt_ids + reference_ids) or "\ufffd" in prompt + reference:
            continue  # a window edge splits a multi-byte character
        yield {
            "prompt": prompt,
            "reference": reference,
            "source": doc.path,
            "start_token": start,
            "n_prompt_tokens": len(prompt_ids),
            "n_reference_tokens": len(reference_ids),
            "prompt_ids": prompt_ids,
        }


def build_continue(docs: Sequence[Document], tokenizer, cfg: PromptSetConfig) -> list[dict]:
    """The ``continue`` rows, ordered by file then position."""
    candidates = [row for doc in docs for row in continue_rows_of(doc, tokenizer, cfg)]
    return [{"id": f"continue-{i:04d}"} | row for i, row in enumerate(evenly(candidates, cfg.continue_count))]


# ---------------------------------------------------------------- writing


def write_jsonl(rows: Sequence[dict], path: Path) -> None:
    """Write rows as jsonl atomically (a temp file renamed into place)."""
    write_text_atomically(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_prompt_sets(workdir: Path, out: Path, cfg: PromptSetConfig | None = None) -> dict:
    """Build ``complete.jsonl``, ``continue.jsonl`` and ``manifest.json`` in ``out``; returns the manifest."""
    cfg = cfg or PromptSetConfig()
    workdir, out = Path(workdir), Path(out)
    meta = json.loads((workdir / "corpus.json").read_text())  # the held-out files, read from the recorded root
    docs = [Document(rel, (Path(meta["root"]) / rel).read_text(encoding="utf-8")) for rel in meta["heldout_files"]]
    if not docs:
        raise ValueError(f"{workdir / 'corpus.json'} lists no held-out files")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(workdir / "tokenizer"))
    out.mkdir(parents=True, exist_ok=True)
    sets = {"complete": build_complete(docs, tokenizer, cfg), "continue": build_continue(docs, tokenizer, cfg)}
    for name, rows in sets.items():
        if not rows:
            raise ValueError(f"the held-out files in {workdir} yield no {name!r} prompts")
        write_jsonl(rows, out / f"{name}.jsonl")
    corpus = json.loads((workdir / "corpus.json").read_text())
    manifest = {
        "config": asdict(cfg),
        "counts": {name: len(rows) for name, rows in sets.items()},
        "sha256": {f"{name}.jsonl": _sha256(out / f"{name}.jsonl") for name in sets},
        "corpus_sha256": corpus.get("sha256"),
        "tokenizer_sha256": _sha256(workdir / "tokenizer" / "tokenizer.json"),
        "heldout_files": [d.path for d in docs],
        "command": "specfamily-zoo prompts --workdir work/zoo --out specfamily/zoo/data/prompts",
    }
    write_text_atomically(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


