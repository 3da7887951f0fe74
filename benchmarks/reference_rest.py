"""Our rest drafter beside the registry's REST retriever (``draftretriever==0.1.1``): same tokens, same prompts, tau.

The reference runs in its own venv (``benchmarks/reference_venvs.sh``) as a subprocess
(``reference_rest_worker.py``), its datastore written from our datastore's own ``tokens.npy`` (the same token
sequences). REST's decoding loop patches a Llama for tree attention on a GPU; what the package is, is the retrieval,
and under greedy decoding the verifier's verdict on a tree depends only on the tree and the greedy text (lossless),
so the reference's tau is measured by a greedy replay: from each context the reference's retrieval (REST's loop:
spans max_span..2, the first that retrieves) gives a tree, the longest path that equals the greedy text is accepted,
plus the target's token. Ours is a real run (``sf.generate``, every option explicit, constant gamma = continuation),
checked against plain greedy decoding; our own passes give the contexts at which both retrievals are compared
(paths, accepted length). The package's search draws from an unseeded generator: ``--repeats`` replays, the spread
printed. See docs/reference-packages.md for what 0.1.1 actually retrieves::

    python benchmarks/reference_rest.py --threads 1 --per-category 1 --max-new-tokens 64
    python benchmarks/reference_rest.py --prompts 4 --max-new-tokens 32 \\
        --write-fixture benchmarks/fixtures/reference_rest.json   # the fixture the test reads
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

import specfamily as sf

HERE = Path(__file__).resolve().parent
WORKER = HERE / "reference_rest_worker.py"
VENVS = [Path("/work/sidevenv/rest-orig"), Path("/work/sidevenv/rest")]
PACKAGES = {"0.1.0": "REST", "0.1.1": "ADED"}  # REST's own DraftRetriever; the registry's (ADED's)


def our_run(target, prompts: list[list[int]], args) -> list[dict]:
    """Our rest (every option explicit) and plain decoding on ``prompts``: tokens, passes, the contexts verified."""
    drafter = sf.create_drafter("rest", target, gamma=args.continuation, policy=None, datastore=str(args.datastore),
                                min_span=args.min_span, max_span=args.max_span, continuation=args.continuation,
                                max_matches=args.max_matches, max_tree_size=args.max_tree_size)
    rows = []
    for prompt in prompts:
        plain = sf.generate(target, None, prompt, max_new_tokens=args.max_new_tokens)
        result = sf.generate(target, drafter, prompt, max_new_tokens=args.max_new_tokens)
        trace = result.trace
        contexts = [sum(trace.kept[:i]) for i in range(len(trace))]
        rows.append({"tokens": result.tokens, "plain": plain.tokens, "passes": result.metrics.target_passes,
                     "contexts": contexts, "accepted": [len(a) for a in trace.accepted],
                     "drafted": [len(d) for d in trace.draft_tokens],
                     "replay_passes": replay(drafter, prompt, plain.tokens, args.continuation)})
    return rows


def tree_accepted(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    """Greedy verification of a token tree: the depth of the longest root path equal to a prefix of ``truth``."""
    node, depth = -1, 0
    for token in truth:
        node = next((i for i, (t, p) in enumerate(zip(tokens, parents, strict=True)) if p == node and t == token), None)
        if node is None:
            return depth
        depth += 1
    return depth


def replay(drafter, prompt: list[int], greedy: list[int], gamma: int) -> int:
    """The passes a greedy replay takes with our drafter's own proposals (as the loop calls it: gamma capped at the
    tokens left - 1): the method the reference's tau is measured by, checked on ours against our real run."""
    done, passes = 0, 0
    while done < len(greedy):
        cap = min(gamma, len(greedy) - done - 1)
        draft = drafter.propose(SimpleNamespace(tokens=prompt + greedy[:done]), cap) if cap > 0 else None
        done += 1 + (tree_accepted(draft.tokens.tolist(), draft.parents.tolist(), greedy[done:]) if draft else 0)
        passes += 1
    return passes


def reference_run(args, venv: Path, prompts: list[list[int]], ours: list[dict], vocab_size: int) -> dict:
    """The worker in ``venv``: its replay passes and, at our contexts, its retrieved paths (per repeat)."""
    job = {"tokens": str(Path(args.datastore) / "tokens.npy"), "vocab_size": vocab_size, "choices": args.choices,
           "k": args.max_matches, "long": args.continuation, "min_span": args.min_span, "max_span": args.max_span,
           "repeats": args.repeats, "prompts": [{"ids": p, "greedy": o["plain"], "contexts": o["contexts"]}
                                                for p, o in zip(prompts, ours, strict=True)]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    try:
        done = subprocess.run([str(venv / "bin" / "python"), str(WORKER), f.name], stdout=subprocess.PIPE,
                              text=True, env=env, check=False)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"draftretriever worker in {venv} failed ({done.returncode}): its stderr is above")
    return json.loads(done.stdout.strip().splitlines()[-1])


def accepted(paths: list[list[int]], truth: list[int]) -> int:
    best = 0
    for path in paths:
        n = 0
        while n < min(len(path), len(truth)) and path[n] == truth[n]:
            n += 1
        best = max(best, n)
    return best


def trie_nodes(paths: list[list[int]]) -> int:
    return len({tuple(path[: i + 1]) for path in paths for i in range(len(path))})


def reference_columns(name: str, reference: dict, ours: list[dict], i: int) -> dict:
    """One reference's columns for prompt i: replay tau (mean, min, max over repeats); at our contexts (first
    repeat) the drafts it proposed, their mean trie size and the tokens greedy verification accepts."""
    run, n = ours[i], len(ours[i]["plain"])
    taus = [n / rep[i]["passes"] for rep in reference["repeats"]]
    first = reference["repeats"][0][i]["paths"]
    hits = [accepted(paths, run["plain"][c:]) for paths, c in zip(first, run["contexts"], strict=True)]
    return {f"{name}_tau_mean": statistics.mean(taus), f"{name}_tau_min": min(taus), f"{name}_tau_max": max(taus),
            f"{name}_drafted": sum(bool(p) for p in first), f"{name}_accepted": sum(hits),
            f"{name}_nodes": statistics.mean(trie_nodes(p) for p in first)}


def compare(categories, ours: list[dict], references: dict[str, dict]) -> dict:
    """Per prompt and overall: our tau (real run and replay), each reference's replay tau, and what each side
    drafted and would have had accepted at our contexts."""
    rows = []
    for i, (category, run) in enumerate(zip(categories, ours, strict=True)):
        row = {"category": category, "ours_tau": len(run["tokens"]) / run["passes"],
               "ours_replay_tau": len(run["plain"]) / run["replay_passes"],
               "ours_equals_plain": run["tokens"] == run["plain"], "contexts": len(run["contexts"]),
               "ours_drafted": sum(d > 0 for d in run["drafted"]), "ours_accepted": sum(run["accepted"]),
               "ours_nodes": statistics.mean(run["drafted"])}
        for name, reference in references.items():
            row.update(reference_columns(name, reference, ours, i))
        rows.append(row)
    tokens = sum(len(run["plain"]) for run in ours)
    overall = {"ours": tokens / sum(run["passes"] for run in ours),
               "ours_replay": tokens / sum(run["replay_passes"] for run in ours)}
    for name, reference in references.items():
        taus = [tokens / sum(r["passes"] for r in rep) for rep in reference["repeats"]]
        overall.update({f"{name}_mean": statistics.mean(taus), f"{name}_min": min(taus), f"{name}_max": max(taus)})
    return {"rows": rows, "overall": overall, "references": list(references)}


def markdown(report: dict) -> str:
    names = report["references"]
    head = ["prompt", "category", "ours tau (replayed)", *[f"{n} tau (min-max)" for n in names],
            "drafted: ours / " + " / ".join(names), "mean tree nodes: ours / " + " / ".join(names),
            "accepted at our contexts: ours / " + " / ".join(names), "ours = plain"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, r in enumerate(report["rows"]):
        cells = [str(i), r["category"], f"{r['ours_tau']:.3f} ({r['ours_replay_tau']:.3f})",
                 *[f"{r[n + '_tau_mean']:.3f} ({r[n + '_tau_min']:.3f}-{r[n + '_tau_max']:.3f})" for n in names],
                 " / ".join(str(r[k + "_drafted"]) for k in ["ours", *names]) + f" of {r['contexts']}",
                 " / ".join(f"{r[k + '_nodes']:.1f}" for k in ["ours", *names]),
                 " / ".join(str(r[k + "_accepted"]) for k in ["ours", *names]),
                 "yes" if r["ours_equals_plain"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    o = report["overall"]
    spreads = [f"**{o[n + '_mean']:.3f}** ({o[n + '_min']:.3f}-{o[n + '_max']:.3f})" for n in names]
    lines.append("| overall | | " + f"**{o['ours']:.3f}** ({o['ours_replay']:.3f}) | " + " | ".join(spreads)
                 + " | | | | |")
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--datastore", type=Path, default=None, help="ours (default: the zoo target's own)")
    parser.add_argument("--venv", type=Path, nargs="+", default=VENVS,
                        help="side venvs, each with a draftretriever (reference_venvs.sh)")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=None, help="keep only the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--min-span", type=int, default=2)
    parser.add_argument("--max-span", type=int, default=16)
    parser.add_argument("--continuation", type=int, default=10, help="max draft length (REST's long)")
    parser.add_argument("--max-matches", type=int, default=512, help="ours' max_matches (REST's k)")
    parser.add_argument("--max-tree-size", type=int, default=8)
    parser.add_argument("--choices", type=int, default=None, help="REST's choices (default: --max-tree-size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--write-fixture", type=Path, default=None)
    args = parser.parse_args(argv)
    args.choices = args.max_tree_size if args.choices is None else args.choices
    return args


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    import common

    from specfamily.drafters.rest.drafter import corpus_datastore

    target = sf.load_target(args.target)
    if args.datastore is None:  # the fixture's: the zoo corpus's (zoo:smollm2's default datastore is chat text)
        args.datastore = corpus_datastore(target)
        if not (args.datastore / "meta.json").is_file():
            from specfamily.drafters.rest.default_store import build_default

            build_default(args.datastore, target.tokenizer, target.vocab_size)
    prompts, categories = common.spec_bench_prompts(args.per_category, target.tokenizer)
    prompts, categories = prompts[: args.prompts], categories[: args.prompts]
    ours = our_run(target, prompts, args)
    references = {}
    for venv in args.venv:
        reference = reference_run(args, venv, prompts, ours, target.vocab_size)
        references[PACKAGES.get(reference["version"], f"draftretriever {reference['version']}")] = reference
    report = compare(categories, ours, references)
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.write_fixture:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                    if k not in ("json", "write_fixture", "venv")}
        args.write_fixture.parent.mkdir(parents=True, exist_ok=True)
        passes = {name: [[r["passes"] for r in rep] for rep in ref["repeats"]] for name, ref in references.items()}
        args.write_fixture.write_text(json.dumps({**settings, "packages": {n: r["version"] for n, r in
                                                                           references.items()},
                                                  "prompts": prompts, "categories": categories,
                                                  "greedy": [run["plain"] for run in ours],
                                                  "reference_passes": passes, "overall": report["overall"]}))


if __name__ == "__main__":
    main()
