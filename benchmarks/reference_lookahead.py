"""Our lookahead drafter beside hao-ai-lab's package (``lade==0.0.2``): same target, prompts, W, N, G, greedy; tau.

The reference runs in its own venv (``benchmarks/reference_venvs.sh``: transformers 4.34, which lade's patched
Llama forward and greedy search are written for) as a subprocess (``reference_lade_worker.py``), on a copy of the
zoo target's folder whose config.json old transformers reads (``rope_theta`` at the top level; the weights are
symlinked). Ours runs here with every option given explicitly (W, N, G, ``prompt_pool=False``: lade 0.0.2 fills
its pool only from the Jacobi window) at two draft lengths: N - 1 (ours, a full match commits N tokens) and N - 2
(lade's cap: its match loop commits at most N - 1 tokens a pass, see docs/reference-packages.md). tau = new tokens
/ target forward calls, the prefill included, on both sides (lade's counted at the embedding layer). Every text is
checked against plain greedy decoding (ours against ours, lade's against transformers 4.34's ``generate``), and the
two plain texts against each other::

    python benchmarks/reference_lookahead.py --threads 1 --per-category 1 --max-new-tokens 64
    python benchmarks/reference_lookahead.py --prompts 4 --max-new-tokens 32 \\
        --write-fixture benchmarks/fixtures/reference_lookahead.json   # the fixture the test reads
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import specfamily as sf

HERE = Path(__file__).resolve().parent
WORKER = HERE / "reference_lade_worker.py"
VENV = Path("/work/sidevenv/lade")


def old_transformers_copy(source: Path, folder: Path) -> Path:
    """``folder`` with ``source``'s weights symlinked and its config.json as transformers 4.3x reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{source}: rope {rope} has no transformers 4.3x form here")
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    config["rope_scaling"] = None
    config["torch_dtype"] = config.pop("dtype", "float32")
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for weights in source.glob("*.safetensors"):
        link = folder / weights.name
        if not link.exists():
            link.symlink_to(weights)
    return folder


def reference_run(venv: Path, model: Path, prompts: list[list[int]], args, eos: int) -> dict:
    """lade's tokens and forward counts (and transformers 4.34's plain greedy tokens) on ``prompts``."""
    job = {"model": str(model), "prompts": prompts, "window": args.window, "ngram": args.ngram,
           "guesses": args.guesses, "max_new_tokens": args.max_new_tokens, "eos": eos, "threads": args.threads}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": ""}
    try:
        done = subprocess.run([str(venv / "bin" / "python"), str(WORKER), f.name], stdout=subprocess.PIPE, text=True,
                              env=env, check=False)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"lade worker failed ({done.returncode}): its stderr is above")
    return json.loads(done.stdout.strip().splitlines()[-1])


def our_run(target, prompts: list[list[int]], args, gamma: int, plains: list[list[int]]) -> list[dict]:
    """Our lookahead at draft length ``gamma`` (every option explicit) on ``prompts``; ``plains``: plain decoding's
    tokens (filled on the first call)."""
    drafter = sf.create_drafter("lookahead", target, gamma=gamma, policy=None, window=args.window,
                                ngram=args.ngram, guesses=args.guesses, prompt_pool=False, seed=0)
    rows = []
    for i, prompt in enumerate(prompts):
        if len(plains) <= i:
            plains.append(sf.generate(target, None, prompt, max_new_tokens=args.max_new_tokens).tokens)
        result = sf.generate(target, drafter, prompt, max_new_tokens=args.max_new_tokens)
        rows.append({"tokens": result.tokens, "passes": result.metrics.target_passes, "plain": plains[i]})
        print(f"ours gamma={gamma}: prompt {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
    return rows


def tau(tokens: int, passes: int) -> float:
    return tokens / passes if passes else float("nan")


def compare(prompts, categories, reference: dict, ours: dict[int, list[dict]], ngram: int) -> dict:
    """Per prompt and overall: tau of lade and of ours at N - 1 and N - 2, and the text checks."""
    rows, totals = [], {"lade": [0, 0], ngram - 1: [0, 0], ngram - 2: [0, 0]}
    for i, (prompt, category) in enumerate(zip(prompts, categories, strict=True)):
        ref = reference["rows"][i]
        row = {"category": category, "prompt_tokens": len(prompt), "lade_tau": tau(len(ref["tokens"]), ref["forwards"]),
               "lade_equals_its_plain": ref["tokens"] == ref["plain"],
               "plains_equal": ref["plain"] == ours[ngram - 1][i]["plain"]}
        totals["lade"][0] += len(ref["tokens"])
        totals["lade"][1] += ref["forwards"]
        for gamma, runs in ours.items():
            run = runs[i]
            row[f"ours_gamma{gamma}_tau"] = tau(len(run["tokens"]), run["passes"])
            row[f"ours_gamma{gamma}_equals_plain"] = run["tokens"] == run["plain"]
            totals[gamma][0] += len(run["tokens"])
            totals[gamma][1] += run["passes"]
        rows.append(row)
    overall = {("lade" if k == "lade" else f"ours_gamma{k}"): tau(*v) for k, v in totals.items()}
    return {"rows": rows, "overall": overall}


def markdown(report: dict, ngram: int) -> str:
    g1, g2 = ngram - 1, ngram - 2
    lines = [f"| prompt | category | lade tau | ours tau (gamma {g1}) | ours tau (gamma {g2}) | texts = plain |",
             "| --- | --- | --- | --- | --- | --- |"]
    for i, row in enumerate(report["rows"]):
        same = all(row[k] for k in row if k.endswith("equals_plain") or k.endswith("equals_its_plain"))
        lines.append(f"| {i} | {row['category']} | {row['lade_tau']:.3f} | {row[f'ours_gamma{g1}_tau']:.3f} | "
                     f"{row[f'ours_gamma{g2}_tau']:.3f} | {'yes' if same and row['plains_equal'] else 'NO'} |")
    o = report["overall"]
    lines.append(f"| overall | | {o['lade']:.3f} | {o[f'ours_gamma{g1}']:.3f} | {o[f'ours_gamma{g2}']:.3f} | |")
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--venv", type=Path, default=VENV, help="the side venv with lade (reference_venvs.sh)")
    parser.add_argument("--per-category", type=int, default=1, help="Spec-Bench first turns per category")
    parser.add_argument("--prompts", type=int, default=None, help="keep only the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--window", type=int, default=4, help="W (lade's WINDOW_SIZE)")
    parser.add_argument("--ngram", type=int, default=4, help="N (lade's LEVEL), >= 3")
    parser.add_argument("--guesses", type=int, default=4, help="G (lade's GUESS_SET_SIZE)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--write-fixture", type=Path, default=None,
                        help="write prompts, settings and lade's outputs here (what the test compares ours with)")
    return parser.parse_args(argv)


def fixture(args, prompts, categories, reference: dict, report: dict) -> dict:
    return {"package": "lade==0.0.2", "transformers": reference["transformers"], "torch": reference["torch"],
            "target": args.target, "window": args.window, "ngram": args.ngram, "guesses": args.guesses,
            "max_new_tokens": args.max_new_tokens, "prompt_pool": False, "seed": 0,
            "prompts": prompts, "categories": categories,
            "lade": [{"tokens": r["tokens"], "forwards": r["forwards"]} for r in reference["rows"]],
            "overall": report["overall"], "command": "python benchmarks/" + " ".join(
                [Path(sys.argv[0]).name, *sys.argv[1:]])}


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    import common

    target = sf.load_target(args.target)
    prompts, categories = common.spec_bench_prompts(args.per_category, target.tokenizer)
    prompts, categories = prompts[: args.prompts], categories[: args.prompts]
    source = Path(target.model.name_or_path)
    with tempfile.TemporaryDirectory() as folder:
        model = old_transformers_copy(source, Path(folder) / "model")
        reference = reference_run(args.venv, model, prompts, args, eos=min(target.eos_token_ids))
    plains: list[list[int]] = []
    ours = {gamma: our_run(target, prompts, args, gamma, plains) for gamma in (args.ngram - 1, args.ngram - 2)}
    report = compare(prompts, categories, reference, ours, args.ngram)
    report["reference_versions"] = {"transformers": reference["transformers"], "torch": reference["torch"]}
    print(markdown(report, args.ngram))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.write_fixture:
        args.write_fixture.parent.mkdir(parents=True, exist_ok=True)
        args.write_fixture.write_text(json.dumps(fixture(args, prompts, categories, reference, report)))


if __name__ == "__main__":
    main()
