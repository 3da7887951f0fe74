"""The dependency floor is what is tested: under the lowest transformers pyproject allows, import specfamily and
decode greedily on a tiny GQA Llama (the lean forward's packed-GQA path) and a GPT-2, token for token against
transformers' own generate. Run by .ci/run after installing that version."""

from __future__ import annotations

import sys

import torch
import transformers

import specfamily as sf
from specfamily.testing import tiny_target


def main() -> int:
    for family, options in (("llama", {"kv_heads": 1}), ("gpt2", {})):
        target = tiny_target(family, vocab_size=64, dtype=torch.float32, **options)
        ids = torch.tensor([[5, 9, 2, 7]])
        reference = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=16, min_new_tokens=16, pad_token_id=0)[0, 4:].tolist()
        plain = sf.generate(target, None, ids[0], max_new_tokens=16).tokens
        drafted = sf.generate(target, sf.create_drafter("prompt_lookup", target, gamma=2), ids[0],
                              max_new_tokens=16).tokens
        if not (plain == drafted == reference):
            print(f"transformers {transformers.__version__}, {family}: greedy differs: {plain} {drafted} {reference}")
            return 1
        print(f"transformers {transformers.__version__}, {family}: 16 greedy tokens identical to generate()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
