"""Self-distillation data: the target's own answers to user turns it wrote itself, with its features captured.

``specfamily-zoo distill --out DIR`` works batch by batch. User turns are Magpie turns (sampled from the chat
template's user prefix) or requests about functions of the zoo corpus (``code_share`` of the batches), minus those
overlapping Spec-Bench; the target answers greedily and its final-norm hidden state is kept for every fed position
from the same generation (``engine='fast'``: ``fast_answers``; ``engine='generate'``: transformers' ``generate()``).

Each batch is one ``batch-NNNNN.safetensors``, written atomically: ``tokens`` (int32, conversations back to back),
``features`` (float16, one row per token but each conversation's last), ``starts`` and ``answer_starts`` (int64),
and the user turns in the metadata. Batch b draws from seed ``seed * 1_000_003 + b``, so a rerun skips finished
batches, and ``--workers W --worker i`` splits them between processes. ``distilled.DistilledData`` reads DIR.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from specfamily.io.chat import chat_prompt_ids
from specfamily.io.files import write_atomically
from specfamily.recipes import user_turns
from specfamily.recipes.fast_answers import fast_answers
from specfamily.runtime.lean import LeanLlama
from specfamily.runtime.lean_support import lean_unsupported
from specfamily.runtime.matmul import MATMUL_KINDS
from specfamily.train.distilled import load_distilled

FEATURE_DTYPES = ("float16", "bfloat16", "float32")
ENGINES = ("fast", "generate")


@dataclass
class DistillConfig:
    out: str  # folder of batch files (keep it outside git)
    target: str = "zoo:smollm2"
    conversations: int = 2048  # batches = ceil(conversations / batch); dropped turns make the kept count smaller
    batch: int = 16
    user_tokens: int = 64  # longest Magpie user turn; a turn that does not end in time is dropped
    answer_tokens: int = 256
    user_temperature: float = 1.0
    user_top_p: float = 0.95
    code_share: float = 0.2  # share of the batches asking about zoo-corpus functions
    seed: int = 0
    workers: int = 1
    worker: int = 0
    max_minutes: float = 0.0  # 0 = until done; else stop after the batch that crosses it (rerun to continue)
    feature_dtype: str = "float16"
    engine: str = "fast"  # answers: fast (fast_answers: static cache, lean forward) or generate (transformers')
    # the fast engine's matmul (specfamily.runtime.matmul); exact: generate()'s float32 sums; None: stream on the CPU,
    # exact on a GPU (the stream kernel is a CPU kernel)
    matmul: str | None = None

    def __post_init__(self) -> None:
        for name in ("conversations", "batch", "user_tokens", "answer_tokens", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.worker < self.workers:
            raise ValueError(f"worker must be in 0..{self.workers - 1}, got {self.worker}")
        if not 0.0 <= self.code_share <= 1.0:
            raise ValueError(f"code_share must be in [0, 1], got {self.code_share}")
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {', '.join(FEATURE_DTYPES)}, got {self.feature_dtype!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.matmul is not None and self.matmul not in MATMUL_KINDS:
            raise ValueError(f"matmul must be one of {', '.join(MATMUL_KINDS)}, got {self.matmul!r}")

    @property
    def batches(self) -> int:
        return math.ceil(self.conversations / self.batch)


def batch_path(out: str | Path, index: int) -> Path:
    return Path(out) / f"batch-{index:05d}.safetensors"


def is_code_batch(cfg: DistillConfig, index: int) -> bool:
    """Code batches spread evenly: batch b asks about code when floor((b + 1) s) > floor(b s)."""
    return math.floor((index + 1) * cfg.code_share) > math.floor(index * cfg.code_share)


@dataclass
class Teacher:
    """The distillation teacher and what every batch uses: its tokenizer, the prefix, the filter, the code snippets."""

    model: torch.nn.Module
    tokenizer: object
    eos: int
    prefix_ids: torch.Tensor  # (1, P)
    keep: user_turns.NgramFilter
    snippets: list[str]
    lean: LeanLlama | None = None  # the fast engine's forward; None: answers by generate()


def load_teacher(cfg: DistillConfig) -> Teacher:
    from specfamily.core.target import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"  # load_target's default
    matmul = (cfg.matmul or ("stream" if device == "cpu" else "exact")) if cfg.engine == "fast" else "exact"
    target = load_target(cfg.target, device=device, dtype=torch.float32, matmul=matmul)
    if cfg.engine == "fast" and target.lean is None:
        raise ValueError(f"engine 'fast' needs a target the lean forward covers: {lean_unsupported(target.model)}; "
                         f"use --engine generate")
    tokenizer = target.tokenizer
    prefix = tokenizer(user_turns.user_prefix(tokenizer), add_special_tokens=False, return_tensors="pt").input_ids
    snippets = user_turns.corpus_functions() if cfg.code_share > 0 else []
    return Teacher(target.model.eval(), tokenizer, int(target.eos_token_id), prefix, user_turns.spec_bench_filter(),
                   snippets, target.lean if cfg.engine == "fast" else None)


def magpie_turns(teacher: Teacher, cfg: DistillConfig, generator_seed: int) -> list[str]:
    """``batch`` user turns sampled from the user prefix; unfinished ones come back empty."""
    torch.manual_seed(generator_seed)
    ids = teacher.prefix_ids.repeat(cfg.batch, 1)
    out = teacher.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=cfg.user_temperature, top_p=cfg.user_top_p, top_k=0,
                                 max_new_tokens=cfg.user_tokens, eos_token_id=teacher.eos, pad_token_id=teacher.eos)
    turns = []
    for row in out[:, ids.shape[1]:].tolist():
        finished = teacher.eos in row
        turns.append(teacher.tokenizer.decode(row[: row.index(teacher.eos)]).strip() if finished else "")
    return turns


def answer(teacher: Teacher, prompts: list[list[int]], answer_tokens: int) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy answers: (conversation tokens, features of all but the last) per prompt, by the teacher's engine."""
    if teacher.lean is not None:
        return fast_answers(teacher.lean, prompts, teacher.eos, answer_tokens)
    return generate_answers(teacher, prompts, answer_tokens)


def generate_answers(teacher: Teacher, prompts: list[list[int]],
                     answer_tokens: int) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy answers of the left-padded batch: (conversation tokens, features of all but the last) per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), teacher.eos, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    out = teacher.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=answer_tokens,
                                 eos_token_id=teacher.eos, pad_token_id=teacher.eos, output_hidden_states=True,
                                 return_dict_in_generate=True, top_p=None, top_k=None, temperature=None)
    steps = [step[-1] for step in out.hidden_states]  # [(B, width, H), (B, 1, H), ...], after the final norm
    fed = torch.cat(steps, dim=1)  # (B, width + generated - 1, H): the feature of every fed position
    results = []
    for row, prompt in enumerate(prompts):
        new = out.sequences[row, width:].tolist()
        new = new[: new.index(teacher.eos) + 1] if teacher.eos in new else new
        tokens = prompt + new
        features = fed[row, width - len(prompt): width - len(prompt) + len(tokens) - 1]
        results.append((tokens, features))
    return results


def make_batch(teacher: Teacher, cfg: DistillConfig, index: int) -> dict | None:
    """Write batch ``index``; None when every turn was dropped (nothing written, the batch counts as done)."""
    seed = cfg.seed * 1_000_003 + index
    code = is_code_batch(cfg, index)
    turns = user_turns.code_requests(teacher.snippets, cfg.batch, seed) if code else magpie_turns(teacher, cfg, seed)
    kept = [t for t in dict.fromkeys(turns) if t and teacher.keep.clean(t)]
    record = {"index": index, "code": code, "asked": len(turns), "kept": len(kept)}
    if kept:
        prompts = [chat_prompt_ids(teacher.tokenizer, [turn]) for turn in kept]
        answer_started = time.perf_counter()
        convs = answer(teacher, prompts, cfg.answer_tokens)
        record["answer_seconds"] = round(time.perf_counter() - answer_started, 2)
        record["answer_tokens"] = sum(len(t) - len(p) for (t, _), p in zip(convs, prompts, strict=True))
        write_batch(cfg, index, kept, prompts, convs)
        record["tokens"] = sum(len(t) for t, _ in convs)
    else:
        write_atomically(batch_path(cfg.out, index).with_suffix(".empty"), lambda tmp: tmp.write_text("{}"))
    return record


def write_batch(cfg: DistillConfig, index: int, kept: list[str], prompts: list[list[int]],
                convs: list[tuple[list[int], torch.Tensor]]) -> None:
    lengths = [len(tokens) for tokens, _ in convs]
    starts = torch.tensor([0, *lengths]).cumsum(0)
    tensors = {
        "tokens": torch.tensor([t for tokens, _ in convs for t in tokens], dtype=torch.int32),
        "features": torch.cat([f for _, f in convs]).to(getattr(torch, cfg.feature_dtype)).contiguous(),
        "starts": starts.to(torch.int64),
        "answer_starts": torch.tensor([len(p) for p in prompts], dtype=torch.int64),
    }
    metadata = {"user_turns": json.dumps(kept), "config": json.dumps(asdict(cfg))}
    write_atomically(batch_path(cfg.out, index), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def done(cfg: DistillConfig, index: int) -> bool:
    path = batch_path(cfg.out, index)
    return path.is_file() or path.with_suffix(".empty").is_file()


def distill(cfg: DistillConfig) -> dict:
    """Make this worker's missing batches (within the time budget); return and record what this call did."""
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    mine = [b for b in range(cfg.worker, cfg.batches, cfg.workers) if not done(cfg, b)]
    started = time.perf_counter()
    records = []
    if mine:
        teacher = load_teacher(cfg)
        for index in tqdm(mine, desc=f"distill worker {cfg.worker}", unit="batch"):
            if cfg.max_minutes and time.perf_counter() - started > 60 * cfg.max_minutes:
                break
            batch_started = time.perf_counter()
            record = make_batch(teacher, cfg, index)
            records.append({**record, "seconds": round(time.perf_counter() - batch_started, 1)})
    answered = sum(r.get("answer_tokens", 0) for r in records)
    answering = sum(r.get("answer_seconds", 0.0) for r in records)
    summary = {"worker": cfg.worker, "batches_made": len(records), "seconds": round(time.perf_counter() - started, 1),
               "tokens": sum(r.get("tokens", 0) for r in records), "remaining": len(mine) - len(records),
               "answer_tokens": answered, "answer_seconds": round(answering, 2),
               "answer_tokens_per_s": round(answered / answering, 1) if answering else 0.0, "batches": records}
    log = Path(cfg.out) / f"worker-{cfg.worker}.log.jsonl"
    with log.open("a") as handle:
        handle.write(json.dumps(summary) + "\n")
    return summary


def report(folder: str | Path) -> dict:
    """Conversations, tokens, disk use and wall time of the data in ``folder``."""
    train, heldout = load_distilled(folder)
    files = list(Path(folder).glob("batch-*"))
    seconds = 0.0
    for log in Path(folder).glob("worker-*.log.jsonl"):
        seconds += sum(json.loads(line)["seconds"] for line in log.read_text().splitlines() if line.strip())
    both = (train, heldout)
    return {
        "conversations": {"train": len(train), "heldout": len(heldout)},
        "code_conversations": sum(user_turns.is_code_request(turn) for c in both for turn in c.turns),
        "tokens": int(sum(c.tokens.numel() for c in both)),
        "answer_tokens": int(sum(c.answer_tokens().numel() for c in both)),
        "disk_mb": round(sum(f.stat().st_size for f in files) / 2**20, 1),
        "worker_seconds": round(seconds, 1),
    }
