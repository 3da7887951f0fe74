"""Shared helpers of the benchmark scripts: loading, prompts, our and transformers' sides, pass costs.

Every comparison is a pair, our side against theirs (and our plain decoding beside a drafter's), timed in one
process with a fixed thread count, prompt by prompt (``pairs``: the schedule, the fresh drafter objects per
repeat, the ratios); outputs are compared token for token on every run. The report's tables and files are in
``bench_report``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_report import describe_mismatches, environment, markdown_table, write_json, write_text  # noqa: F401
from pairs import (  # noqa: F401 - the scripts' shared names, one import away
    Method,
    Mismatch,
    OursFactory,
    OursFn,
    Output,
    PairResult,
    Skipped,
    TheirsFn,
    first_mismatch,
    measure_pair,
    stateless,
)
from scipy import stats

CLOCKS = ("wall", "cpu")


def paired_interval(ratios: list[float]) -> tuple[float, float] | None:
    """The 95% t interval of the mean of per-round ratios (each round's methods run back to back, so a round's
    ratio to plain cancels what the machine did during that round); None under 2 rounds."""
    if len(ratios) < 2:
        return None
    mean, half = statistics.fmean(ratios), stats.t.ppf(0.975, len(ratios) - 1) * stats.sem(ratios)
    return mean - half, mean + half


def make_clock(kind: str, device: str = "cpu") -> Callable[[], float]:
    """``wall``: perf_counter (after a synchronise on a CUDA ``device``); ``cpu``: this process's CPU time (steadier
    on a shared core with one thread)."""
    if kind == "wall":
        from specfamily.core.costs import device_clock

        return device_clock(device)
    if kind == "cpu":
        return time.process_time
    raise ValueError(f"clock must be one of {CLOCKS}, got {kind!r}")


def set_threads(threads: int) -> None:
    """Fix torch's intra-op thread count (and one inter-op thread when still settable)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set once in this process


def quiet_transformers() -> None:
    """Keep transformers' per-call generation warnings out of the report."""
    from transformers.utils import logging

    logging.set_verbosity_error()


def load_pair(target_name: str, draft_name: str | None, device: str = "cpu", dtype: str | None = None,
              matmul: str = "exact"):
    """(Target, draft PreTrainedModel or None) on ``device``; ``dtype`` (e.g. "float32") default: float32 on CPU,
    the weights' own elsewhere; ``matmul``: how the target's lean forward multiplies (``sf.load_target``). Names may
    be folders or zoo: names."""
    import specfamily as sf

    dtype = getattr(torch, dtype) if dtype else torch.float32 if device == "cpu" else None
    target = sf.load_target(target_name, device=device, dtype=dtype, matmul=matmul)
    draft = None
    if draft_name is not None:
        draft = sf.load_target(draft_name, device=device, dtype=dtype).model
    return target, draft


def load_prompts(path: str | Path, count: int, tokenizer=None, max_prompt_tokens: int | None = None) -> list[list[int]]:
    """The first ``count`` prompts of a jsonl file (``prompt_ids``, else ``prompt``/``text`` tokenized)."""
    path = Path(path)
    if count < 1:
        raise ValueError(f"prompt count must be >= 1, got {count}")
    if not path.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist")
    prompts: list[list[int]] = []
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            prompts.append(_prompt_ids(json.loads(line), tokenizer, f"{path}:{number}"))
            if len(prompts) == count:
                break
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} holds no prompts")
    if max_prompt_tokens is not None:
        prompts = [ids[-max_prompt_tokens:] for ids in prompts]
    return prompts


def spec_bench_prompts(per_category: int, tokenizer) -> tuple[list[list[int]], list[str]]:
    """(first-turn prompts, their categories): ``per_category`` Spec-Bench questions of each of its 13 categories,
    evenly spaced within each, through the tokenizer's chat template (as ``dataset=spec_bench`` builds them)."""
    from specfamily.eval.datasets import DatasetSpec
    from specfamily.eval.datasets import load_prompts as load_dataset_prompts

    spec = DatasetSpec(name="spec_bench", path="specfamily:spec_bench", field=None, id_field="question_id",
                       chat_template=True, add_special_tokens=False, num_examples=per_category,
                       select="per_category", turns_field="turns", max_turns=1, category_field="category")
    prompts = load_dataset_prompts(spec, tokenizer)
    return [p.ids for p in prompts], [str(p.category) for p in prompts]


def _prompt_ids(row: dict, tokenizer, where: str) -> list[int]:
    if "prompt_ids" in row:
        return [int(i) for i in row["prompt_ids"]]
    text = row.get("prompt", row.get("text"))
    if not isinstance(text, str):
        raise ValueError(f"{where}: a prompt row needs 'prompt_ids', 'prompt' or 'text'")
    if tokenizer is None:
        raise ValueError(f"{where}: text prompts need a target with a tokenizer")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def hf_generate(model, prompt: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """transformers ``generate`` at temperature 0 (batch 1, explicit all-ones mask): the new tokens."""
    ids = torch.tensor([prompt], device=model.device)
    pad = model.generation_config.pad_token_id
    if pad is None:
        eos = model.generation_config.eos_token_id
        pad = 0 if eos is None else (eos if isinstance(eos, int) else eos[0])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            pad_token_id=pad, **kwargs,
        )
    return out[0, len(prompt) :].tolist()


def ours_fn(target, drafter, max_new_tokens: int) -> OursFn:
    """Our ``sf.generate`` at temperature 0 as a benchmark callable."""
    import specfamily as sf

    def run(prompt: list[int]) -> Output:
        result = sf.generate(target, drafter, prompt, max_new_tokens=max_new_tokens)
        return Output(result.tokens, result.metrics.target_passes)

    return run


def ours_factory(target, make: Callable[[], object], max_new_tokens: int) -> OursFactory:
    """Our side as ``Method.ours`` wants it: each call builds a new drafter object with ``make()`` (None: plain
    decoding), so no timed request is served by a drafter that has seen it (``pairs``)."""
    return lambda: ours_fn(target, make(), max_new_tokens)


def as_ours(fn: TheirsFn) -> OursFn:
    """A plain decoder (one pass per token) as an ``ours`` callable."""
    return lambda prompt: (lambda tokens: Output(tokens, len(tokens)))(fn(prompt))


def median_time(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


@dataclass
class PassCosts:
    """Median seconds of our target's verification passes with the prompt in the cache (forward + commit)."""

    prompt_length: int
    prefill: float  # one pass over the whole prompt from an empty cache
    t: dict[int, float]  # n -> one pass over the root and n - 1 draft tokens

    def ratio(self, n: int) -> float:
        """t(n) / t(1)."""
        return self.t[n] / self.t[1]


def pass_costs(target, prompt: list[int], sizes: Sequence[int], repeats: int, clock: Callable[[], float]) -> PassCosts:
    """Time ``Target.forward`` + ``commit``: the prefill, then passes over n fed tokens (sizes interleaved)."""
    from specfamily.core.costs import measure_pass_seconds

    ids = torch.tensor(prompt if len(prompt) >= 2 else prompt * 2, dtype=torch.long, device=target.device)

    def prefill() -> None:
        target.reset()
        target.forward(ids[:-1])
        target.commit([])

    prefill_s = median_time(prefill, max(1, min(repeats, 5)), clock)
    seconds = measure_pass_seconds(target, ids.tolist(), [n - 1 for n in sizes], repeats, clock)
    return PassCosts(len(prompt), prefill_s, {g + 1: t for g, t in seconds.items()})


def raw_greedy(model, max_new_tokens: int) -> TheirsFn:
    """The floor for plain decoding: a bare greedy loop over the model (no generate, no wrapper)."""
    from transformers import DynamicCache

    eos = model.generation_config.eos_token_id
    stop = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))

    @torch.inference_mode()
    def run(prompt: list[int]) -> list[int]:
        cache = DynamicCache(config=model.config)
        ids = torch.tensor([prompt], device=model.device)
        out: list[int] = []
        while len(out) < max_new_tokens:
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits
            ids = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
            out.append(int(ids))
            if out[-1] in stop:
                break
        return out

    return run


def add_matmul_option(parser) -> None:
    """``--matmul``: how our target's lean forward multiplies (``specfamily.runtime.matmul``)."""
    parser.add_argument("--matmul", default="auto", choices=("exact", "skinny", "stream", "auto"),
                        help="our target's matmul: exact (bit-identical to transformers), skinny, stream (the C++ "
                             "few-row kernel), or auto (the fastest here, measured at load); transformers' rows "
                             "always multiply as transformers does")


def of_categories(prompts: list, categories: list[str], wanted: str | None) -> list:
    """The prompts of the comma-separated Spec-Bench ``wanted`` categories (None or empty: all), in their order; an
    unknown name is refused with the names there are."""
    if not wanted:
        return prompts
    names = wanted.split(",")
    unknown = sorted(set(names) - set(categories))
    if unknown:
        raise ValueError(f"unknown Spec-Bench categories {unknown}; there are {sorted(set(categories))}")
    return [p for p, category in zip(prompts, categories, strict=True) if category in names]


def workload(args):
    """(clock, target, prompts) for a batch benchmark's ``args`` (threads, clock, target, matmul, per_category,
    max_prompt_tokens, optionally categories): the threads set, the target loaded, Spec-Bench's first turns (of the
    chosen categories) cut to their last ``max_prompt_tokens`` (0: whole)."""
    import specfamily as sf

    set_threads(args.threads)
    quiet_transformers()
    clock = make_clock(args.clock)
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, categories = spec_bench_prompts(args.per_category, target.tokenizer)
    prompts = of_categories(prompts, categories, getattr(args, "categories", None))
    if args.max_prompt_tokens > 0:
        prompts = [p[-args.max_prompt_tokens :] for p in prompts]
    return clock, target, prompts
