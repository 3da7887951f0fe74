"""Search recycling's tree template: how often each node of the reference's 80-node template lies on the accepted
path, measured on the zoo's instruct prompts (chat prompts written for the project, none from an evaluation set).

Recycling drafts with the whole template (depth 6, constant policy, one drafter and table across prompts, greedy)
and, at every pass, reads each template node's token path off the table as it stood; a node counts as accepted when
its path equals the first tokens the pass committed (accepted nodes, then the target's token). A child is accepted
only with its parent, so ordering the nodes by their acceptance rate is parent-first, and the first n nodes of that
order are the n-node sub-tree with the most expected accepted tokens per pass (the sum of their rates): the
``searched`` template. Printed: the rank paths in that order with their rates and the running sum, as JSON::

    python benchmarks/recycling_template.py --threads 1 --prompts 32 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np
import torch

import specfamily as sf
from specfamily.drafters.recycling.template import TEMPLATES, rank_paths


def node_paths(root: int, successors: np.ndarray, known: np.ndarray, paths: list[tuple[int, ...]],
               stop: frozenset[int]) -> list[tuple[int, ...] | None]:
    """Each rank path's token path from ``root`` through the table (None where the table has no row to follow)."""
    tokens: dict[tuple[int, ...], tuple[int, ...] | None] = {(): ()}
    for path in paths:  # breadth first: a parent before its children
        above = tokens[path[:-1]]
        last = root if not above else above[-1]
        grows = above is not None and bool(known[last]) and last not in stop
        tokens[path] = (*above, int(successors[last, path[-1]])) if grows else None
    return [tokens[path] for path in paths]


def count_hits(target, drafter, prompts: list[list[int]], max_new_tokens: int,
               paths: list[tuple[int, ...]]) -> tuple[np.ndarray, int]:
    """Per rank path, the passes whose committed tokens began with its token path; and the number of passes."""
    hits, passes, stop = np.zeros(len(paths)), 0, frozenset(target.eos_token_ids)
    seen: list[list[tuple[int, ...] | None]] = []
    propose, observe = drafter.propose, drafter.observe

    def spying_propose(ctx, gamma):
        table = drafter.table
        seen.append(node_paths(ctx.tokens[-1], table.successors, table.known, paths, stop))
        return propose(ctx, gamma)

    def spying_observe(outcome):
        nonlocal passes
        if seen:
            accepted = outcome.tokens[:-1]
            for i, path in enumerate(seen.pop()):
                hits[i] += path is not None and len(path) <= len(accepted) and tuple(accepted[:len(path)]) == path
            passes += 1
        observe(outcome)

    drafter.propose, drafter.observe = spying_propose, spying_observe
    for ids in prompts:
        seen.clear()
        sf.generate(target, drafter, ids, max_new_tokens=max_new_tokens)
    return hits, passes


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--template", default="2.2.2", help="the template whose nodes are rated")
    parser.add_argument("--prompts", type=int, default=32, help="instruct prompts (spread over the set)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="stream")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specfamily.zoo.prompts import prompt_ids

    target = sf.load_target(args.target, matmul=args.matmul)
    paths = rank_paths(TEMPLATES[args.template])
    drafter = sf.create_drafter("recycling", target, gamma=max(map(len, paths)), template=args.template,
                                max_tree_size=None)
    hits, passes = count_hits(target, drafter, prompt_ids("instruct", args.prompts, target.tokenizer),
                              args.max_new_tokens, paths)
    order = sorted(range(len(paths)), key=lambda i: (-hits[i], len(paths[i]) + sum(paths[i]), paths[i]))
    rows, total = [], 0.0
    for i in order:
        total += hits[i] / passes
        rows.append({"path": list(paths[i]), "rate": round(hits[i] / passes, 4), "expected": round(total, 4)})
    print(json.dumps({"passes": passes, "nodes": rows}))
    return rows


if __name__ == "__main__":
    main()
