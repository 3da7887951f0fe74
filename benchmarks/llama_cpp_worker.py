"""llama.cpp's side of ``benchmarks/llama_cpp_peer.py``: a worker that runs under the python that has
``llama-cpp-python`` (a side virtual environment, see docs/llama-cpp-peer.md) and answers one JSON object per line.

It imports nothing from specfamily (the side environment has neither torch nor the project). Requests on stdin,
one answer each on stdout:

    {"op": "load", "model": PATH, "threads": 2, "n_ctx": 4096, "arms": {"plain": null, "look": {"num_pred_tokens": 2}}}
        -> {"ok": true, "llama_cpp": VERSION, "system_info": "..."}
    {"op": "generate", "arm": "look", "prompt": [ids], "max_new_tokens": N, "stop": [ids]}
        -> {"ok": true, "tokens": [ids], "seconds": S, "passes": P}
    {"op": "quit"}

An arm loaded with ``null`` options is llama.cpp's greedy decoding; one with a dict is the same with
``LlamaPromptLookupDecoding(**options)`` as its draft model (``{}``: the library's defaults). Each generation starts
from an empty KV cache (no prompt reuse across requests, as ours), includes the prompt's prefill, and stops after
``max_new_tokens`` or at a token of ``stop`` (kept, as ours keeps the EOS). ``seconds`` is the wall time of the
generation alone; ``passes`` counts llama.cpp's decode calls (the prefill included), so tokens / passes is tau as
the project defines it. A failed request answers ``{"ok": false, "error": "..."}`` and the worker keeps serving.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class Engines:
    """The loaded llama.cpp instances, one per arm (the lookup one keeps every position's logits, plain does not)."""

    by_arm: dict[str, Any] = field(default_factory=dict)


def counting_llama(llama_cpp):
    """A ``Llama`` subclass that counts its decode calls (target passes)."""

    class CountingLlama(llama_cpp.Llama):
        passes = 0

        def eval(self, tokens):
            self.passes += 1
            return super().eval(tokens)

    return CountingLlama


def load(request: dict, engines: Engines) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    threads, n_ctx = int(request["threads"]), int(request["n_ctx"])
    common = dict(model_path=request["model"], n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                  n_gpu_layers=0, seed=0, verbose=False)
    llama = counting_llama(llama_cpp)
    for arm, options in request["arms"].items():
        if options is None:
            engines.by_arm[arm] = llama(**common)
        else:  # llama-cpp-python 0.3.36 turns logits_all on for a draft model but sizes its logits buffer by the
            # argument (n_batch rows when False): a prompt plus answer past n_batch tokens then fails. Asking avoids it.
            engines.by_arm[arm] = llama(**common, logits_all=True, draft_model=LlamaPromptLookupDecoding(**options))
    info = llama_cpp.llama_print_system_info()
    return {"ok": True, "llama_cpp": llama_cpp.__version__,
            "system_info": info.decode() if isinstance(info, bytes) else str(info)}


def generate(request: dict, engines: Engines) -> dict:
    arm = request["arm"]
    if arm not in engines.by_arm:
        raise ValueError(f"no arm {arm!r} was loaded (loaded: {', '.join(engines.by_arm) or 'none'})")
    llm, prompt = engines.by_arm[arm], [int(t) for t in request["prompt"]]
    limit, stop = int(request["max_new_tokens"]), {int(t) for t in request.get("stop", ())}
    if len(prompt) + limit > llm.n_ctx():
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({limit}) exceeds n_ctx {llm.n_ctx()}")
    llm.reset()  # no reuse of the previous request's cache: the prompt is prefilled every time
    llm.passes = 0
    tokens: list[int] = []
    start = time.perf_counter()
    for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        tokens.append(int(token))
        if len(tokens) >= limit or tokens[-1] in stop:
            break
    seconds = time.perf_counter() - start
    return {"ok": True, "tokens": tokens, "seconds": seconds, "passes": llm.passes}


def answer(request: dict, engines: Engines) -> dict:
    """One request's answer; errors become ``{"ok": false}`` answers naming them."""
    op = request.get("op")
    try:
        if op == "load":
            return load(request, engines)
        if op == "generate":
            return generate(request, engines)
        raise ValueError(f"unknown op {op!r}: expected load, generate or quit")
    except Exception as err:  # noqa: BLE001 - the client prints the reason and stops
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def serve(stdin: TextIO, stdout: TextIO) -> None:
    engines = Engines()
    for line in stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        stdout.write(json.dumps(answer(request, engines)) + "\n")
        stdout.flush()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
