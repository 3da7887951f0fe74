"""Fixtures for the recipes and trainer tests: a tiny corpus of generated Python files and a prepared work folder
(registered for every test folder by tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfamily.recipes.corpus import is_heldout

TINY_VOCAB = 300  # byte-level alphabet (256) + end-of-text + a few merges


def module_source(seed: int, functions: int = 12) -> str:
    """A small but varied Python module: functions with and without docstrings, a class."""
    parts = [f'"""Module number {seed}: helpers for counting and joining things."""\n\nimport os\n\n']
    for j in range(functions):
        name = f"helper_{seed}_{j}"
        if j % 3 == 0:
            parts.append(f"def {name}(values, limit={j + 1}):\n    total = 0\n    for value in values:\n"
                         f"        if value > limit:\n            total += value * {seed + j}\n    return total\n\n\n")
        else:
            parts.append(f'def {name}(text, sep="{"-" * (j % 4 + 1)}"):\n    """Join the words of text with sep '
                         f'({j} times)."""\n    words = text.split()\n    joined = sep.join(words)\n'
                         f"    if len(joined) > {10 * j}:\n        return joined[:{10 * j}]\n"
                         f"    return os.path.join(joined, str({seed}))\n\n\n")
    parts.append(f"class Counter{seed}:\n    def __init__(self):\n        self.count = 0\n\n"
                 f"    def bump(self, by=1):\n        \"\"\"Add by to the count.\"\"\"\n        self.count += by\n"
                 f"        return self.count\n")
    return "".join(parts)


def heldout_names(count: int) -> list[str]:
    """File names the default 2% by-file split puts in the held-out set."""
    names = [f"pkg/mod_{i}.py" for i in range(2000) if is_heldout(f"pkg/mod_{i}.py")]
    return names[:count]


def write_corpus(root: Path, train_files: int = 8, heldout_files: int = 2) -> Path:
    names = heldout_names(heldout_files)
    names += [f"pkg/mod_{i}.py" for i in range(2000) if not is_heldout(f"pkg/mod_{i}.py")][:train_files]
    for seed, name in enumerate(sorted(names)):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(module_source(seed))
    return root


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def prepared(tiny_corpus, tmp_path_factory) -> Path:
    """A work folder with tokenizer/, train.npy, heldout.npy and corpus.json for the tiny corpus."""
    from specfamily.recipes.prepare import prepare

    workdir = tmp_path_factory.mktemp("work")
    prepare(workdir, tiny_corpus, vocab_size=TINY_VOCAB)
    return workdir
