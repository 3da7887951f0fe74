"""Fixtures of the eval tests: tiny saved models with a tokenizer and a local jsonl prompt set (no hub, no zoo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_helpers import QUESTIONS, TEXTS, chat_tokenizer, tiny_llama, tiny_tokenizer

from specfamily.eval.config import configs_dir


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> dict[str, Path]:
    """Folders ``target`` and ``draft`` (save_pretrained, with the tokenizer) and a ``prompts.jsonl``."""
    root = tmp_path_factory.mktemp("eval_models")
    tokenizer = tiny_tokenizer()
    for name, seed, layers in (("target", 0, 2), ("draft", 1, 1)):
        tiny_llama(seed, layers).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    rows = [{"id": f"p{i}", "text": text, "lang": "py"} for i, text in enumerate(TEXTS)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"target": root / "target", "draft": root / "draft", "prompts": root / "prompts.jsonl"}


@pytest.fixture(scope="session")
def chat_pair(tmp_path_factory) -> dict[str, Path]:
    """A tiny ``target`` whose tokenizer has a chat template, and ``questions.jsonl`` in Spec-Bench's shape."""
    root = tmp_path_factory.mktemp("eval_chat")
    tiny_llama(0, 2).save_pretrained(root / "target")
    chat_tokenizer().save_pretrained(root / "target")
    (root / "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in QUESTIONS))
    return {"target": root / "target", "questions": root / "questions.jsonl"}


@pytest.fixture
def compose_config():
    """``compose_config(overrides) -> DictConfig`` from the shipped configs (Hydra's compose API)."""
    from hydra import compose, initialize_config_dir

    def compose_with(overrides: list[str]):
        with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
            return compose(config_name="config", overrides=list(overrides))

    return compose_with
