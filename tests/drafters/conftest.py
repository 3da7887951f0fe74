"""Fixtures the batched-drafter tests share: zoo:code-target and five short code prompts (token ids).

A module that defines a fixture of the same name uses its own."""

import pytest

import specfamily as sf


@pytest.fixture(scope="module")
def code_target():
    return sf.load_target("zoo:code-target")


@pytest.fixture(scope="module")
def prompts(code_target):
    texts = ["def add(a, b):\n    return", "import os\nimport sys\n\ndef main", "class Foo:\n    def __init__(self",
             "for i in range(10):", "x = [i * i for i in"]
    return [code_target.tokenizer(t)["input_ids"] for t in texts]
