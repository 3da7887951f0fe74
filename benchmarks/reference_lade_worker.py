"""Runs hao-ai-lab's lookahead decoding package (``lade==0.0.2``) in its own venv: the reference side of
``reference_lookahead.py``. Imports only torch, transformers (4.34) and lade, never specfamily.

Reads a JSON job (``model``: an HF folder old transformers can load; ``prompts``: token id lists; ``window``,
``ngram``, ``guesses``, ``max_new_tokens``) from the file given as the first argument and prints one JSON object:
per prompt, lade's new tokens and the target's forward calls (counted at the embedding layer, which every forward
runs once), and plain greedy decoding's new tokens from the same transformers. tau = new tokens / forwards, the
prefill included, as specfamily counts it.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def forward_counter(model) -> list[int]:
    """A one-element list counting the model's forward calls (a hook on the embedding: one call per forward)."""
    count = [0]

    def hook(module, inputs, output):
        count[0] += 1

    model.get_input_embeddings().register_forward_hook(hook)
    return count


def generate(model, prompt: list[int], max_new_tokens: int, eos: int, use_lade: bool) -> list[int]:
    """The new tokens of greedy ``generate`` (lade's loop with ``use_lade``, else transformers' own)."""
    from transformers import GenerationConfig

    os.environ["USE_LADE"] = "1" if use_lade else "0"
    ids = torch.tensor([prompt])
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


def main(path: str) -> None:
    import lade
    import transformers

    job = json.loads(open(path).read())
    torch.set_num_threads(int(job.get("threads", 1)))
    lade.augment_all()
    lade.config_lade(WINDOW_SIZE=job["window"], LEVEL=job["ngram"], GUESS_SET_SIZE=job["guesses"], DEBUG=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    count = forward_counter(model)
    eos = int(job["eos"])
    rows = []
    for prompt in job["prompts"]:
        count[0] = 0
        plain = generate(model, prompt, job["max_new_tokens"], eos, use_lade=False)
        plain_forwards, count[0] = count[0], 0
        tokens = generate(model, prompt, job["max_new_tokens"], eos, use_lade=True)
        rows.append({"tokens": tokens, "forwards": count[0], "plain": plain, "plain_forwards": plain_forwards})
        print(f"lade: prompt {len(rows)}/{len(job['prompts'])}", file=sys.stderr, flush=True)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1])
