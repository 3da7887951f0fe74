"""Measure what the zoo's model card (ZOO.md) reports: held-out loss, draft/target agreement, forward-pass timings and
greedy samples; JSON out, Markdown on stdout::

    python -m specfamily.recipes.card --workdir work/zoo --target DIR --draft DIR [--out ZOO-measurements.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedTokenizerFast

from specfamily.core.target_cache import truncate
from specfamily.io.files import write_text_atomically
from specfamily.train.tokens import fixed_windows


@dataclass
class CardConfig:
    workdir: str  # holds train.npy and heldout.npy
    target: str  # HF folder
    draft: str  # HF folder
    prompts: str = ""  # folder with complete.jsonl / continue.jsonl; "" = the shipped prompt sets
    out: str = "ZOO-measurements.json"
    threads: int = 2
    seq_len: int = 512
    windows: int = 0  # held-out windows of seq_len + 1 tokens; 0 = all of them
    agreement_prompts: int = 80  # continue prompts along which the target decodes greedily (why 80: docs/results.md)
    agreement_tokens: int = 128
    context: int = 300  # cached tokens under the timed forwards
    max_n: int = 16  # t(n)/t(1) for n = 2..max_n
    repeats: int = 20  # timed forwards per n (median)
    samples: int = 3  # greedy samples shown in the card
    sample_tokens: int = 96
    collapse_prompts: int = 100
    collapse_tokens: int = 128


@dataclass
class ModelStats:
    path: str
    parameters: int
    heldout_loss: float  # nats/token
    t1_ms: float  # one token on top of a cache of `context` tokens


@dataclass
class CardResult:
    config: dict
    environment: dict
    heldout_tokens: int  # scored positions
    unigram_loss: float  # nats/token, add-one smoothed counts of train.npy
    target: ModelStats
    draft: ModelStats
    agreement_teacher_forced: float  # argmax(draft) == argmax(target) on held-out windows
    agreement_greedy: float  # the same along the target's greedy continuations
    agreement_greedy_se: float  # its standard error: spread of the per-prompt agreement / sqrt(prompts)
    verify_cost: dict[int, float]  # n -> t(n) / t(1) of the target
    collapse_fraction: float  # generations with a non-blank line repeated >= 3 times in a row
    samples: list[dict] = field(default_factory=list)


# ---------------------------------------------------------------- pure helpers


def unigram_loss(train_tokens: np.ndarray, labels: np.ndarray, vocab_size: int) -> float:
    """Mean -log p(label) under add-one smoothed unigram counts of ``train_tokens``."""
    counts = np.bincount(train_tokens.astype(np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts) - np.log(counts.sum())
    return float(-log_p[labels.astype(np.int64)].mean())


def collapsed(text: str, times: int = 3) -> bool:
    """True when some non-blank line repeats ``times`` times in a row (blank lines ignored)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    run = 1
    for previous, line in zip(lines, lines[1:], strict=False):
        run = run + 1 if line == previous else 1
        if run >= times:
            return True
    return False


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def spread(rows: list, count: int) -> list:
    """``count`` rows spread evenly over ``rows``."""
    if count >= len(rows):
        return list(rows)
    return [rows[i] for i in np.linspace(0, len(rows) - 1, num=count).round().astype(int)]


# ---------------------------------------------------------------- model measurements


def load_model(path: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_kernels=False).eval()


@torch.no_grad()
def heldout_pass(target, draft, windows: torch.Tensor, batch: int = 4) -> tuple[float, float, float]:
    """(target loss, draft loss, argmax agreement) over held-out windows, teacher-forced."""
    sums = torch.zeros(3, dtype=torch.float64)
    count = 0
    for chunk in windows.split(batch):
        inputs, labels = chunk[:, :-1], chunk[:, 1:].reshape(-1)
        p_logits = target(input_ids=inputs).logits.float().flatten(0, 1)  # (b * T, V)
        q_logits = draft(input_ids=inputs).logits.float().flatten(0, 1)
        sums[0] += F.cross_entropy(p_logits, labels, reduction="sum").item()
        sums[1] += F.cross_entropy(q_logits, labels, reduction="sum").item()
        sums[2] += (p_logits.argmax(-1) == q_logits.argmax(-1)).sum().item()
        count += labels.numel()
    target_loss, draft_loss, agree = (sums / count).tolist()
    return target_loss, draft_loss, agree


@torch.no_grad()
def greedy(model, ids: list[int], new_tokens: int) -> list[int]:
    """The model's greedy continuation (new tokens only; stops after end-of-text)."""
    inputs = torch.tensor([ids])
    out = model.generate(
        inputs, attention_mask=torch.ones_like(inputs), do_sample=False, max_new_tokens=new_tokens,
        pad_token_id=0, eos_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def pooled_rate(hits: list[int], counts: list[int]) -> tuple[float, float]:
    """r = sum(hits) / sum(counts) and its standard error as a ratio estimator over the n items (0 for one item):
    sqrt(sum((h_i - r c_i)^2) / (n (n - 1))) / mean(c). Equal counts give stdev(h_i / c_i) / sqrt(n)."""
    n, total = len(counts), sum(counts)
    rate = sum(hits) / max(total, 1)
    if n < 2 or total == 0:
        return rate, 0.0
    spread = sum((h - rate * c) ** 2 for h, c in zip(hits, counts, strict=True)) / (n * (n - 1))
    return rate, math.sqrt(spread) / (total / n)


@torch.no_grad()
def greedy_agreement(target, draft, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """Fraction of the target's greedy positions where the draft's argmax equals the target's, and its
    standard error over prompts (positions of one prompt are correlated, so prompts are the unit)."""
    hits, counts = [], []
    for ids in prompts:
        continuation = greedy(target, ids, new_tokens)
        seq = torch.tensor([ids + continuation])
        start = len(ids) - 1  # the position that predicts the first new token
        p = target(input_ids=seq).logits[0, start:-1].argmax(-1)
        q = draft(input_ids=seq).logits[0, start:-1].argmax(-1)
        hits.append(int((p == q).sum().item()))
        counts.append(p.numel())
    return pooled_rate(hits, counts)


@torch.no_grad()
def forward_ms(model, context: torch.Tensor, n: int, repeats: int, warmup: int = 3) -> float:
    """Median ms of one forward of ``n`` tokens on top of a KV cache of ``context`` (1, L)."""
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    model(input_ids=context, use_cache=True, **{cache_kw: cache})
    length = context.shape[1]
    step = context[:, -n:] if n <= length else context[:, :1].repeat(1, n)
    times = []
    for i in range(warmup + repeats):
        started = time.perf_counter()
        model(input_ids=step, use_cache=True, **{cache_kw: cache})
        elapsed = time.perf_counter() - started
        truncate(cache, length)
        if i >= warmup:
            times.append(elapsed * 1000)
    return statistics.median(times)


def generations(model, tokenizer, prompts: list[str], new_tokens: int) -> list[str]:
    """Greedy continuations of text prompts, decoded."""
    texts = []
    for prompt in prompts:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        texts.append(tokenizer.decode(greedy(model, ids, new_tokens), skip_special_tokens=True))
    return texts


# ---------------------------------------------------------------- the card


def _model_stats(path: str, model, loss: float, t1: float) -> ModelStats:
    return ModelStats(path, sum(p.numel() for p in model.parameters()), loss, t1)


def collapse_and_samples(target, tokenizer, rows: list[dict], cfg: CardConfig) -> tuple[float, list[dict]]:
    """The fraction of collapsed greedy generations, and a few greedy samples for the card."""
    collapse_rows = spread(rows, cfg.collapse_prompts)
    texts = generations(target, tokenizer, [row["prompt"] for row in collapse_rows], cfg.collapse_tokens)
    fraction = sum(collapsed(text) for text in texts) / max(len(texts), 1)
    sample_rows = spread(rows, cfg.samples)
    generated = generations(target, tokenizer, [row["prompt"] for row in sample_rows], cfg.sample_tokens)
    samples = [
        {"id": row["id"], "source": row["source"], "prompt_tail": "\n".join(row["prompt"].splitlines()[-8:]),
         "generated": text}
        for row, text in zip(sample_rows, generated, strict=True)
    ]
    return fraction, samples


def measure(cfg: CardConfig) -> CardResult:
    """Every number of the model card, measured on ``cfg.threads`` CPU threads."""
    torch.set_num_threads(cfg.threads)
    work, prompt_dir = Path(cfg.workdir), Path(cfg.prompts)
    if not cfg.prompts:  # the shipped prompt sets
        from specfamily.zoo import prompt_set_path

        prompt_dir = prompt_set_path("complete").parent
    target, draft = load_model(cfg.target), load_model(cfg.draft)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(cfg.target)
    heldout = np.load(work / "heldout.npy")
    windows = fixed_windows(heldout, cfg.windows or len(heldout), cfg.seq_len)  # (m, seq_len + 1)
    target_loss, draft_loss, agree_tf = heldout_pass(target, draft, windows)
    unigram = unigram_loss(np.load(work / "train.npy", mmap_mode="r"), windows[:, 1:].numpy(), len(tokenizer))
    continue_rows = spread(read_jsonl(prompt_dir / "continue.jsonl"), cfg.agreement_prompts)
    prompt_ids = [row["prompt_ids"] for row in continue_rows]
    agree_greedy, agree_se = greedy_agreement(target, draft, prompt_ids, cfg.agreement_tokens)
    context = torch.from_numpy(heldout[: cfg.context].astype(np.int64))[None]  # (1, L)
    target_t1 = forward_ms(target, context, 1, cfg.repeats)
    verify_cost = {n: forward_ms(target, context, n, cfg.repeats) / target_t1 for n in range(2, cfg.max_n + 1)}
    draft_t1 = forward_ms(draft, context, 1, cfg.repeats)
    collapse, samples = collapse_and_samples(target, tokenizer, read_jsonl(prompt_dir / "complete.jsonl"), cfg)
    import transformers

    environment = {"torch": torch.__version__, "transformers": transformers.__version__,
                   "threads": torch.get_num_threads(), "machine": platform.machine(),
                   "processor": platform.processor() or platform.platform()}
    return CardResult(
        config=asdict(cfg), environment=environment, heldout_tokens=int(windows[:, 1:].numel()),
        unigram_loss=unigram,
        target=_model_stats(cfg.target, target, target_loss, target_t1),
        draft=_model_stats(cfg.draft, draft, draft_loss, draft_t1),
        agreement_teacher_forced=agree_tf, agreement_greedy=agree_greedy, agreement_greedy_se=agree_se,
        verify_cost=verify_cost,
        collapse_fraction=collapse, samples=samples,
    )


def markdown(result: CardResult) -> str:
    """The card's numbers as Markdown."""
    cfg = result.config
    lines = [
        f"Measured on {result.environment['threads']} CPU threads ({result.environment['processor']}), "
        f"torch {result.environment['torch']}, transformers {result.environment['transformers']}.",
        "",
        "| model | parameters | held-out loss (nats/token) | perplexity | t(1) ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, stats in (("target", result.target), ("draft", result.draft)):
        lines.append(f"| {name} | {stats.parameters:,} | {stats.heldout_loss:.3f} | "
                     f"{math.exp(stats.heldout_loss):.2f} | {stats.t1_ms:.2f} |")
    lines += [
        f"| unigram (add-one) | - | {result.unigram_loss:.3f} | {math.exp(result.unigram_loss):.1f} | - |",
        "",
        f"Held-out positions scored: {result.heldout_tokens:,}.",
        f"Greedy top-1 agreement draft vs target: {result.agreement_teacher_forced:.3f} teacher-forced on held-out "
        f"windows, {result.agreement_greedy:.3f} (standard error {result.agreement_greedy_se:.3f} over prompts) "
        f"along the target's greedy continuations ({cfg['agreement_prompts']} prompts x {cfg['agreement_tokens']} "
        "tokens).",
        f"Target t(1) = {result.target.t1_ms:.2f} ms, draft t(1) = {result.draft.t1_ms:.2f} ms "
        f"(c = {result.draft.t1_ms / result.target.t1_ms:.3f}), on a cache of {cfg['context']} tokens.",
        "",
        "| n | " + " | ".join(str(n) for n in result.verify_cost) + " |",
        "|---|" + "---:|" * len(result.verify_cost),
        "| t(n)/t(1) | " + " | ".join(f"{v:.2f}" for v in result.verify_cost.values()) + " |",
        "",
        f"Greedy generations that collapse into one repeated line: {result.collapse_fraction:.1%} "
        f"({cfg['collapse_prompts']} `complete` prompts x {cfg['collapse_tokens']} tokens).",
    ]
    for sample in result.samples:
        lines += ["", f"Sample `{sample['id']}` ({sample['source']}), the end of the prompt:", "",
                  "```python", sample["prompt_tail"], "```", "", "the target's greedy continuation:", "",
                  "```python", sample["generated"].strip("\n"), "```"]
    return "\n".join(lines) + "\n"


def write_json(result: CardResult, path: Path) -> None:
    write_text_atomically(path, json.dumps(asdict(result), indent=1) + "\n")


def main(argv: list[str] | None = None) -> CardResult:
    parser = argparse.ArgumentParser(
        prog="python -m specfamily.recipes.card", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = CardConfig(workdir="", target="", draft="")
    for name, value in asdict(defaults).items():
        flag = f"--{name.replace('_', '-')}"
        if name in ("workdir", "target", "draft"):
            parser.add_argument(flag, dest=name, required=True)
        else:
            parser.add_argument(flag, dest=name, type=type(value), default=value)
    cfg = CardConfig(**vars(parser.parse_args(argv)))
    result = measure(cfg)
    write_json(result, Path(cfg.out))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
