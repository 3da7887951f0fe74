"""Helpers of the eval tests: a tiny tokenizer, tiny Llama models and the overrides that point a config at them."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "for item in items:\n    print(item)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "import os\nimport sys\n\nprint(sys.argv)\n",
    "while True:\n    break\n",
]
VOCAB = 320
# A ChatML-like template: every message, then the assistant's header when a generation prompt is asked for.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TEXTS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny tokenizer with :data:`CHAT_TEMPLATE` as its chat template."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(seed: int, layers: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.2,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def _run_overrides(target: Path, draft: Path, matmul: str) -> list[str]:
    """Model, drafters and run settings that keep a run on the tiny models to seconds. ``matmul`` is pinned (the
    model configs say ``auto``, which times every kernel kind in each run and picks by the clock)."""
    return [
        f"model.target={target}", f"model.draft={draft}", "model.medusa=null", "model.eagle=null",
        "model.device=cpu", f"model.matmul={matmul}", "drafter.names=[small_model]", "verify_cost.sizes=[0,1,2]",
        "verify_cost.repeats=1", "verify_cost.context=8", "warmup_tokens=2", "progress=false", "plots=false",
        "threads=1",
    ]


def tiny_overrides(pair: dict[str, Path], *extra: str, matmul: str = "exact") -> list[str]:
    """Overrides that point the default config at the tiny pair and keep the run to seconds."""
    return [
        *_run_overrides(pair["target"], pair["draft"], matmul), "dataset=jsonl",
        f"dataset.data_files={pair['prompts']}", "dataset.field=text", "dataset.id_field=id",
        "dataset.num_examples=3", "dataset.max_new_tokens=10", *extra,
    ]


# Spec-Bench-shaped questions: a two-turn question, then a one-turn one, in two categories.
QUESTIONS = [
    {"question_id": 7, "category": "writing", "turns": ["Write a line.", "Now shorter."]},
    {"question_id": 8, "category": "qa", "turns": ["Why?"], "reference": ["Because."]},
]


def chat_overrides(pair: dict[str, Path], *extra: str, matmul: str = "exact") -> list[str]:
    """``dataset=spec_bench`` on the chat target's local questions; the draft model is the target itself."""
    return [
        *_run_overrides(pair["target"], pair["target"], matmul), "dataset=spec_bench", "dataset.path=json",
        f"dataset.data_files={pair['questions']}", "dataset.num_examples=null", "dataset.max_new_tokens=10", *extra,
    ]


def spec_bench_first_turns(tokenizer) -> list[list[int]]:
    """One Spec-Bench first turn per category (13), chat-templated ids: the real-target tests' prompts."""
    from specfamily.eval.datasets import DatasetSpec, load_prompts

    spec = DatasetSpec(name="spec_bench", path="specfamily:spec_bench", field=None, id_field="question_id",
                       chat_template=True, add_special_tokens=False, num_examples=1, select="per_category",
                       turns_field="turns", max_turns=1, category_field="category")
    return [p.ids for p in load_prompts(spec, tokenizer)]


def greedy_reference(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (up to and including an end token)."""
    out = []
    for ids in prompts:
        ids_t = torch.tensor([ids])
        full = model.generate(ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=max_new_tokens,
                              do_sample=False)
        out.append(full[0, len(ids):].tolist())
    return out
