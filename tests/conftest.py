"""Shared fixtures: tiny random fp32 causal LMs of the GPT-2 and Llama families (no hub, no network)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PreTrainedModel

FAMILIES = ("gpt2", "llama")
ATTENTIONS = ("sdpa", "eager")
TINY_VOCAB = 50
pytest_plugins = ["corpus_fixtures"]  # the tiny corpus and prepared work folder (recipes, trainers)


def pytest_configure(config) -> None:
    """Under pytest-xdist (`-n auto` in pyproject.toml) every worker runs torch at one thread: the workers already
    fill the cores, and tiny models at two threads each on two cores spin on each other (a 10 s test took 276 s)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def tiny_config(family: str, **overrides):
    """A 2-layer, 32-wide config with a 50-token vocabulary; weights large enough that masks matter."""
    if family == "gpt2":
        base = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=TINY_VOCAB, n_positions=128, initializer_range=0.3)
        return GPT2Config(**{**base, **overrides})
    if family == "llama":
        base = dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=TINY_VOCAB,
            max_position_embeddings=128,
            initializer_range=0.3,
        )
        return LlamaConfig(**{**base, **overrides})
    raise ValueError(f"unknown tiny model family {family!r}")


def build_tiny_model(family: str, attn: str = "sdpa", seed: int = 0, **overrides) -> PreTrainedModel:
    """A freshly initialised tiny fp32 model in eval mode; the global RNG is left untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), attn_implementation=attn)
    return model.eval()


@pytest.fixture
def tiny_model() -> Callable[..., PreTrainedModel]:
    """Factory: ``tiny_model(family, attn="sdpa", seed=0, **config_overrides)``."""
    return build_tiny_model


@pytest.fixture(params=[(f, a) for f in FAMILIES for a in ATTENTIONS], ids=lambda p: f"{p[0]}-{p[1]}")
def any_tiny_model(request) -> PreTrainedModel:
    """Each tiny family under each supported attention implementation."""
    family, attn = request.param
    return build_tiny_model(family, attn)


# The sample of the slow matrix CI runs (.ci/run tier 2, `pytest -m ci`): sampling conformance at the kit's own
# power on the families and paths the default suite leaves to `-m slow` -- GPT-2 and Mistral targets, self_spec
# skipping an attention layer under sampling, prompt lookup's first-pass drafts under t0.7/top-p and top-k.
CI_SAMPLE = (
    "tests/drafters/test_eagle.py::test_lossless_full_matrix[tree-mistral]",
    "tests/drafters/test_eagle.py::test_lossless_full_matrix[chain-gpt2]",
    "tests/drafters/test_medusa.py::test_lossless_full_matrix[None-gpt2]",
    "tests/drafters/test_small_model.py::test_lossless_full_matrix[gpt2]",
    "tests/drafters/test_self_spec.py::test_lossless_full_matrix[False-gpt2]",
    "tests/drafters/test_prompt_lookup.py::test_lossless_matrix_with_first_pass_drafts[tree-t07-p09-3]",
    "tests/drafters/test_prompt_lookup.py::test_lossless_matrix_with_first_pass_drafts[repeat-k5-1]",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Mark CI's sample of the slow matrix ``ci``; with ``-m ci``, fail when a listed test no longer exists."""
    found = set()
    for item in items:
        if item.nodeid in CI_SAMPLE:
            item.add_marker(pytest.mark.ci)
            found.add(item.nodeid)
    if "ci" in (config.option.markexpr or "") and not config.option.keyword:
        missing = [nodeid for nodeid in CI_SAMPLE if nodeid not in found and nodeid.split("::")[0] in _paths(items)]
        if missing:
            raise pytest.UsageError(f"tests/conftest.py CI_SAMPLE lists tests that were not collected: {missing}")


def _paths(items) -> set[str]:
    return {item.nodeid.split("::")[0] for item in items}


@pytest.fixture
def lean_calls(monkeypatch) -> list[int]:
    """The number of tokens of each pass the lean forward ran (the lean path was taken, not only offered)."""
    from specfamily.runtime.lean import LeanLlama

    calls: list[int] = []
    original = LeanLlama.__call__

    def counted(self, input_ids, *args, **kwargs):
        calls.append(input_ids.shape[1])
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(LeanLlama, "__call__", counted)
    return calls


@pytest.fixture
def int8_unbuilt(monkeypatch):
    """A session where the int8 weight-only kernel cannot build (the real build stays memoised for later tests)."""
    from specfamily.runtime import int8_matmul, kernel

    def fail(*args, **kwargs):
        raise RuntimeError("Error building extension 'specfamily_int8_linear'\nmore lines")

    monkeypatch.setattr(kernel, "build_extension", fail)  # what kernel.build_source calls
    int8_matmul.int8_kernel.cache_clear()
    yield
    int8_matmul.int8_kernel.cache_clear()
