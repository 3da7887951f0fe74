"""Real target shapes on a GPU with random weights: what a pass and plain decoding cost there.

The weights of a real checkpoint cannot reach a lent GPU machine here (zoo:smollm2 is 98 MB as a GGUF, more than the
device tool carries), and timing does not depend on the weights' values: so this builds SmolLM2-135M's architecture
and an 8B Llama-3-shaped one with random weights straight on the device, in the dtype asked, and measures

- the pass-cost curve: a target pass over the root plus g chain tokens over a 512-token cache, g = 0..64
  (``specfamily.core.costs.measure_pass_seconds``, wall clock after a device sync), and t(1 + g) / t(1);
- plain greedy decoding, ours (``sf.generate`` with no drafter) against transformers' ``generate()``: tokens/s, and
  whether the texts are identical (in bfloat16 different kernels may flip near-ties; counted, not asserted).

    python benchmarks/gpu_shapes.py --out shapes.json                       # on the GPU machine
    python benchmarks/gpu_shapes.py --device cpu --shapes smollm2 --dtypes float32 --tokens 8   # a CPU dry run

The head of each random model is scaled (``--spread``) so next-token distributions are peaked like a trained
model's rather than near-uniform (near-uniform logits make every step a near-tie).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specfamily as sf
from specfamily.core.costs import device_clock, measure_pass_seconds
from specfamily.core.target import load_target

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, rope theta
    "smollm2": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=49152, rope_theta=100000.0),
    "llama-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=14336, vocab_size=128256, rope_theta=500000.0),
}
SIZES = (1, 2, 4, 8, 16, 32, 64)


def random_model(shape: str, device: torch.device, dtype: torch.dtype, spread: float) -> LlamaForCausalLM:
    """The shape's architecture, built on ``device`` in ``dtype`` (nothing materialised on the host)."""
    fields = dict(SHAPES[shape])
    rope_theta = fields.pop("rope_theta")
    config = LlamaConfig(**fields, max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(spread)
    return model.eval()


def timed(fn, clock, *args):
    """(seconds ``fn(*args)`` took on ``clock``, what it returned)."""
    start = clock()
    out = fn(*args)
    return clock() - start, out


def plain_vs_transformers(target, model, prompts: list[list[int]], tokens: int, clock) -> dict:
    """Tokens/s of ``sf.generate`` without a drafter and of transformers' greedy ``generate``, same prompts."""
    device = next(model.parameters()).device

    def ours(prompt):
        return sf.generate(target, None, prompt, max_new_tokens=tokens).tokens

    def theirs(prompt):
        ids = torch.tensor([prompt], device=device)
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1,
                             attention_mask=torch.ones_like(ids))
        return out[0, len(prompt):].tolist()

    ours(prompts[0]), theirs(prompts[0])  # warm-up: kernels, allocator, caches
    seconds = {"ours": 0.0, "transformers": 0.0}
    identical = 0
    for prompt in prompts:
        s_ours, t_ours = timed(ours, clock, prompt)
        s_theirs, t_theirs = timed(theirs, clock, prompt)
        seconds["ours"] += s_ours
        seconds["transformers"] += s_theirs
        identical += t_ours == t_theirs
    total = tokens * len(prompts)
    return {"tokens_per_s": {k: total / v for k, v in seconds.items()},
            "ours_vs_transformers": seconds["transformers"] / seconds["ours"],
            "identical": f"{identical}/{len(prompts)}"}


def built(shape: str, dtype_name: str, args):
    """(model, target, seconds to build them, the device's clock, a seeded generator, a random ``args.context``-token
    context) for ``shape`` on ``args.device`` in ``dtype_name``."""
    device, dtype = torch.device(args.device), getattr(torch, dtype_name)
    started = time.perf_counter()
    model = random_model(shape, device, dtype, args.spread)
    target = load_target(model)
    seconds = time.perf_counter() - started
    gen = torch.Generator().manual_seed(1)
    context = torch.randint(0, model.config.vocab_size, (args.context,), generator=gen).tolist()
    return model, target, seconds, device_clock(device), gen, context


def measure(shape: str, dtype_name: str, args) -> dict:
    device = torch.device(args.device)
    model, target, built_seconds, clock, gen, context = built(shape, dtype_name, args)
    vocab = model.config.vocab_size
    seconds = measure_pass_seconds(target, context, args.sizes, repeats=args.repeats, clock=clock)
    prompts = [torch.randint(0, vocab, (64,), generator=gen).tolist() for _ in range(args.prompts)]
    decoding = plain_vs_transformers(target, model, prompts, args.tokens, clock)
    record = {
        "shape": shape, "dtype": dtype_name, "device": str(device),
        "parameters": sum(p.numel() for p in model.parameters()), "lean_forward": target.lean is not None,
        "build_seconds": round(built_seconds, 2),
        "pass_ms": {g: round(1000 * s, 3) for g, s in seconds.items()},
        "pass_ratio": {g: round(s / seconds[0], 3) for g, s in seconds.items()},
        "decoding": decoding,
    }
    if device.type == "cuda":
        record["max_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    del target, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="smollm2,llama-8b")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="per shape; llama-8b runs in bfloat16 only")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--spread", type=float, default=4.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    records = []
    for shape in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            if shape == "llama-8b" and dtype_name == "float32":
                continue
            records.append(emit(measure(shape, dtype_name, args)))
    save(records, args.out)


def emit(record: dict) -> dict:
    """``record`` printed as one JSON line (the log shows each shape as it is measured), returned."""
    print(json.dumps(record), flush=True)
    return record


def save(records: list[dict], out: str | None) -> None:
    """The records and torch's version as one JSON file at ``out`` (None: nowhere)."""
    if out:
        with open(out, "w") as f:
            json.dump({"torch": torch.__version__, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
