"""SmolLM2's paths on a tiny stand-in, for CI (tier ``standin``; the real model is a ``slow`` test that downloads
98 MB and converts 540 MB): a random 2-layer Llama with SmolLM2's vocabulary size (49152), GQA and tied
embeddings, written as a Q4_1-named GGUF in a wheel and converted by the code path ``zoo:smollm2`` takes
(``specfamily.zoo.fetch.fetched_folder`` -> ``convert_gguf``). On it: the lean forward with the skinny matmul,
drafters with a reduced draft vocabulary, greedy text equal to transformers' ``generate`` with drafts verified."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import specfamily as sf
from specfamily.testing.depth import DepthRecorder
from specfamily.zoo import fetch
from specfamily.zoo.catalogue import WheelSource

pytestmark = [pytest.mark.slow, pytest.mark.standin]

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 49152, 64, 2, 4, 2, 128  # SmolLM2: 49152 tokens, 3 query heads per kv
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MEMBER = "llm_standin/Standin-Instruct.Q4_1.gguf"
NEW_TOKENS = 24
DRAFT_VOCAB = 2048  # the reduced draft vocabulary: the ids the prompts and the target's text use come first


def _tokens() -> list[str]:
    """49152 distinct tokens: the specials, the 256 byte-level symbols, two merged pieces, then filler pieces."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    base = [*SPECIALS, *bytes_to_unicode().values(), "Ġt", "he"]  # with the two merges' results
    return base + [f"Ġw{i}" for i in range(VOCAB - len(base))]


def _write_gguf(path: Path) -> None:
    import gguf

    tokens, rng = _tokens(), np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_context_length, 256), (writer.add_embedding_length, HIDDEN),
                       (writer.add_block_count, LAYERS), (writer.add_feed_forward_length, FFN),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_rope_dimension_count, HIDDEN // HEADS), (writer.add_rope_freq_base, 10000.0),
                       (writer.add_layer_norm_rms_eps, 1e-5)):
        add(value)
    writer.add_name("standin")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)

    def tensor(name: str, *shape: int, scale: float = 0.2) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    tensor("token_embd.weight", VOCAB, HIDDEN, scale=1.0)  # no output.weight: the head is tied to it
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    kv = KV_HEADS * HIDDEN // HEADS
    for b in range(LAYERS):
        for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (kv, HIDDEN)), ("attn_v", (kv, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                            ("ffn_down", (HIDDEN, FFN))):
            tensor(f"blk.{b}.{name}.weight", *shape)
        writer.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The stand-in fetched from its wheel and converted, as zoo:smollm2 is (in a private cache)."""
    root = tmp_path_factory.mktemp("standin")
    _write_gguf(root / "standin.gguf")
    wheel = root / "llm_standin-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(root / "standin.gguf", MEMBER)
        archive.writestr("llm_standin-0.0.1.dist-info/METADATA", "Name: llm-standin\nVersion: 0.0.1\n")
    source = WheelSource("llm-standin", "0.0.1", hashlib.sha256(wheel.read_bytes()).hexdigest(), MEMBER, "MIT", 1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(fetch.CACHE_ENV, str(root / "cache"))
        return fetch.fetched_folder("standin", source, wheel=wheel, progress=False)


@pytest.fixture(scope="module")
def skinny(folder):
    return sf.load_target(str(folder), device="cpu", matmul="skinny")


@pytest.fixture(scope="module")
def cases(skinny) -> list[tuple[list[int], list[int]]]:
    """(prompt, transformers' greedy continuation) pairs; prompts repeat a phrase, so lookups find matches."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for length in (6, 11):
        phrase = torch.randint(len(SPECIALS), VOCAB, (length,), generator=gen).tolist()
        prompt = phrase * 2 + phrase[:2]
        ids = torch.tensor([prompt])
        full = skinny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        out.append((prompt, full[0, len(prompt):].tolist()))
    return out


def test_the_stand_in_is_smollm2_shaped(folder, skinny):
    model = skinny.model
    assert (skinny.vocab_size, model.config.num_key_value_heads, model.config.num_hidden_layers) == (VOCAB, 2, 2)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied, as in SmolLM2
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert skinny.matmul == "skinny" and skinny.lean is not None and skinny.lean.ready()
    assert len(skinny.tokenizer) == VOCAB and skinny.tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


def test_plain_decoding_on_the_skinny_target_equals_generate(skinny, cases):
    for prompt, expected in cases:
        assert sf.generate(skinny, None, prompt, max_new_tokens=NEW_TOKENS).tokens == expected


def _draft_vocab(cases) -> list[int]:
    """A reduced draft vocabulary holding the tokens of the prompts and the text, filled up with low ids."""
    used = {token for prompt, expected in cases for token in prompt + expected}
    filler = (token for token in range(VOCAB) if token not in used)
    return sorted(used | {next(filler) for _ in range(DRAFT_VOCAB - len(used))})


DRAFTERS = {
    "prompt_lookup": {"gamma": 4},
    "prompt_lookup tree": {"gamma": 4, "branches": 3},
    "eagle chain reduced": {"weights": "random", "mode": "chain", "gamma": 3, "draft_vocab": "reduced"},
    "eagle tree reduced": {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 12, "draft_vocab": "reduced"},
    "self_spec": {"skip": ["mlp:1"], "gamma": 3},
}


@pytest.mark.parametrize("label", DRAFTERS)
def test_drafters_on_the_skinny_target_equal_generate(skinny, cases, label):
    options = dict(DRAFTERS[label])
    if options.get("draft_vocab") == "reduced":
        options["draft_vocab"] = _draft_vocab(cases)
    drafter = DepthRecorder(sf.create_drafter(label.split()[0], skinny, **options), gamma=options["gamma"])
    proposed: set[int] = set()
    propose = drafter.inner.propose

    def recording(ctx, gamma):
        draft = propose(ctx, gamma)
        proposed.update(draft.tokens.tolist())
        return draft

    drafter.inner.propose = recording
    for prompt, expected in cases:
        assert sf.generate(skinny, drafter, prompt, max_new_tokens=NEW_TOKENS).tokens == expected, label
    assert drafter.stats.passes > 0 and proposed, f"{label} drafted nothing: {drafter.stats.summary()}"
    if "draft_vocab" in options:  # drafts over the reduced vocabulary only, verified over all 49152 tokens
        assert len(options["draft_vocab"]) == DRAFT_VOCAB and proposed <= set(options["draft_vocab"])
        vocab = drafter.inner.model.vocab  # the draft head reads the target head's rows for those ids only
        assert vocab is not None and vocab.ids.tolist() == options["draft_vocab"]
        assert drafter.inner.model.head_weight.shape == (DRAFT_VOCAB, HIDDEN)
