"""Where self-distillation's user turns come from, and what keeps evaluation text out of them. Pure text functions.

- **Magpie** (Xu et al. 2024): an instruct model fed only its chat template's prefix up to the user's turn writes a
  user request itself; :func:`user_prefix` is that prefix for any chat template.
- **Code from the zoo corpus**: a function from the training split with a request about it (explain, review, ...).

:class:`NgramFilter` drops a turn that shares any run of 8 lower-cased words with a Spec-Bench turn, or contains one.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PLACEHOLDER = "\x00USER\x00"
NGRAM = 8
CODE_REQUESTS = (
    "Explain what this Python function does, step by step:\n\n```python\n{code}\n```",
    "Review this Python function. Point out bugs or edge cases and suggest improvements:\n\n```python\n{code}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{code}\n```",
    "Add type hints and a docstring to this function and show the result:\n\n```python\n{code}\n```",
    "Rewrite this function to be simpler and more readable:\n\n```python\n{code}\n```",
)


def user_prefix(tokenizer) -> str:
    """The chat template's text before a user's first message (system prompt included, if the template adds one)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("Magpie user turns need a chat template; this tokenizer has none")
    text = tokenizer.apply_chat_template([{"role": "user", "content": PLACEHOLDER}], tokenize=False,
                                         add_generation_prompt=True)
    if PLACEHOLDER not in text:
        raise ValueError("the chat template does not place the user's message verbatim")
    return text.split(PLACEHOLDER)[0]


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@dataclass
class NgramFilter:
    """Rejects text sharing an ``n``-word run with the evaluation turns (or containing one of them whole)."""

    turns: Sequence[str]
    n: int = NGRAM
    _grams: set[tuple[str, ...]] = field(init=False, repr=False)
    _short: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._grams = set().union(*(ngrams(turn, self.n) for turn in self.turns)) if self.turns else set()
        self._short = [turn.lower().strip() for turn in self.turns if len(turn.split()) < self.n and turn.strip()]

    def clean(self, text: str) -> bool:
        lowered = text.lower()
        return not (ngrams(text, self.n) & self._grams) and not any(turn in lowered for turn in self._short)


def spec_bench_filter() -> NgramFilter:
    """The filter against every turn of the shipped Spec-Bench questions."""
    from specfamily.eval.datasets import shipped_set_path
    from specfamily.zoo.prompts import load_prompt_set

    questions = load_prompt_set("", shipped_set_path("spec_bench"))
    return NgramFilter([turn for row in questions["turns"] for turn in row])


def functions(sources: Iterable[str], min_lines: int = 4, max_lines: int = 30) -> list[str]:
    """Top-level and method definitions of ``min_lines``..``max_lines`` lines, as source text, in file order."""
    found = []
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                body = lines[node.lineno - 1 : node.end_lineno]
                if min_lines <= len(body) <= max_lines:
                    indent = len(body[0]) - len(body[0].lstrip())
                    found.append("\n".join(line[indent:] for line in body))
    return found


def code_requests(snippets: Sequence[str], count: int, seed: int) -> list[str]:
    """``count`` requests about snippets drawn with ``seed`` (deterministic)."""
    if not snippets:
        raise ValueError("no functions to ask about")
    rng = random.Random(seed)
    return [rng.choice(CODE_REQUESTS).format(code=rng.choice(snippets)) for _ in range(count)]


def is_code_request(turn: str) -> bool:
    """Whether ``turn`` is one of :data:`CODE_REQUESTS` (its text before the code)."""
    return any(turn.startswith(request.split("{code}")[0]) for request in CODE_REQUESTS)


def corpus_functions(files: int = 200) -> list[str]:
    """Functions of ``files`` evenly spaced files of the zoo corpus's training split (the running interpreter's
    standard library; parsing all of it takes about a minute)."""
    from specfamily.recipes.corpus import load_corpus

    train = load_corpus().train
    return functions(doc.text for doc in train[:: max(1, len(train) // files)])
