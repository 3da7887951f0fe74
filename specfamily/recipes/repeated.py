"""A repeated-task workload: the same instructions asked about several functions of the zoo corpus's held-out files,
where a drafter that remembers earlier outputs (``suffix``) should pay. Rows are ``{"question_id", "category",
"turns"}`` like Spec-Bench's, grouped by instruction (the category). Write a set with
``python -m specfamily.recipes.repeated OUT.jsonl`` and run it with::

    specfamily dataset=jsonl dataset.data_files=OUT.jsonl dataset.field=null dataset.turns_field=turns \
        dataset.category_field=category dataset.chat_template=true dataset.add_special_tokens=false drafter=suffix
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

CODE = "\n\n```python\n{code}\n```"
INSTRUCTIONS = {
    "docstring": "Add type hints and a docstring to this Python function and show the result:" + CODE,
    "explain": "Explain what this Python function does, step by step:" + CODE,
    "tests": "Write unit tests with pytest for this Python function:" + CODE,
}


def repeated_task_rows(functions: Sequence[str], per_task: int, instructions: dict[str, str] | None = None,
                       offset: int = 0) -> list[dict]:
    """Every instruction asked about ``per_task`` functions (``functions[offset:offset + per_task]``), grouped by
    instruction in the order given."""
    instructions = INSTRUCTIONS if instructions is None else instructions
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task!r}")
    chosen = list(functions[offset : offset + per_task])
    if len(chosen) < per_task:
        raise ValueError(f"{per_task} functions wanted from offset {offset}, only {len(chosen)} available")
    rows = []
    for name, template in instructions.items():
        if "{code}" not in template:
            raise ValueError(f"instruction {name!r} has no {{code}} field")
        for index, code in enumerate(chosen):
            rows.append({"question_id": f"{name}-{offset + index}", "category": name,
                         "turns": [template.format(code=code)]})
    return rows


def heldout_functions(min_lines: int = 5, max_lines: int = 16, limit: int = 64) -> list[str]:
    """Up to ``limit`` functions of ``min_lines``..``max_lines`` lines from the zoo corpus's held-out files, in
    file order (the running interpreter's standard library: deterministic for one Python)."""
    from specfamily.recipes.corpus import load_corpus
    from specfamily.recipes.user_turns import functions

    return functions((doc.text for doc in load_corpus().heldout), min_lines, max_lines)[:limit]


def write_jsonl(path: str | Path, rows: Sequence[dict]) -> Path:
    """Write ``rows`` as JSON lines, atomically."""
    from specfamily.io.files import write_text_atomically

    return write_text_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .jsonl file to write")
    parser.add_argument("--per-task", type=int, default=4, help="functions asked about per instruction")
    parser.add_argument("--offset", type=int, default=0, help="skip this many held-out functions first")
    args = parser.parse_args(argv)
    rows = repeated_task_rows(heldout_functions(limit=args.offset + args.per_task), args.per_task, offset=args.offset)
    print(f"{len(rows)} prompts -> {write_jsonl(args.out, rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
