"""Every steady batched proposal of a copy drafter beside its evidence and what it would have had accepted.

    python benchmarks/batch_evidence.py --drafters prompt_lookup,suffix --batch-sizes 4 --max-prompt-tokens 32 \
        --max-new-tokens 32 --requests-per-slot 2 --json short.json
    python benchmarks/batch_evidence.py --show short.json

Per batch size and drafter: one untimed call (the costs and the pooled acceptance warm, as in ``batch_sweep.py``),
then one recorded call. Wraps ``BatchPlanning._planned`` (the loop's lookahead path: proposals at full length, then
cut to the planned lengths): per slot and pass the proposal's size, depth and evidence (``Draft.evidence``: the match
length), the depth-1 acceptance the plan would use without evidence, the planned depth, and the plan's kind and
predicted gain. Greedy decoding is deterministic, so every proposal's acceptance, drafted or not, is read off the
request's final text: the longest path of its tree that the text continues (the counterfactual of drafting it whole).
``--arms main,evidence``: the plan as before this change (every draft valued by its request's drafted passes) and with
its evidence, each learning from its own calls. ``--show`` tabulates depth-1 acceptance and mean accepted depth per
evidence and whether the plan drafted.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

from common import workload

import specfamily as sf
from specfamily.core import batch_evidence, batch_lengths, batch_plan

RECORDS: list[dict] = []


def _install() -> None:
    planned, plan = batch_plan.BatchPlanning._planned, batch_lengths.LengthPolicy._plan
    last: dict = {}

    def plan_(self, batch, prospects, proposed, together, decided=None):
        decided = decided or self._decide(batch, prospects, proposed, together)
        last.update(kind=decided[2], gain=decided[1])
        return plan(self, batch, prospects, proposed, together, decided)

    def planned_(self, group, gammas, drafts, c0):
        pooled = self._pooled() if self.lookahead and any(gammas) else None
        alphas = [self._alpha(r, pooled)[:1] if pooled is not None else [] for r in group]
        last.clear()
        out = planned(self, group, gammas, drafts, c0)
        for r, full, cut, alpha in zip(group, drafts, out, alphas, strict=True):
            if not len(full):
                continue
            RECORDS.append(
                {
                    "request": r.index,
                    "at": len(r.new_tokens),
                    "size": len(full),
                    "depth": int(full.depths().max()),
                    "evidence": full.evidence,
                    "tokens": full.tokens.tolist(),
                    "parents": full.parents.tolist(),
                    "planned": int(cut.depths().max()) if len(cut) else 0,
                    "alpha1": alpha,
                    "B": len(group),
                    **last,
                }
            )
        return out

    batch_plan.BatchPlanning._planned = planned_
    batch_lengths.LengthPolicy._plan = plan_


def accepted(tokens: list[int], parents: list[int], future: list[int]) -> int:
    """The deepest path of the tree (tokens, parents) that ``future`` continues."""
    node, depth = -1, 0
    while depth < len(future):
        child = next(
            (i for i, (t, p) in enumerate(zip(tokens, parents, strict=True)) if p == node and t == future[depth]), None
        )
        if child is None:
            break
        node, depth = child, depth + 1
    return depth


def _unconditioned(on: bool) -> None:
    """With ``on``, the plan values every draft as before session 27: by its request's drafted passes alone."""
    batch_plan.BatchPlanning._valued_alpha = (lambda self, r, d, pooled: self._alpha(r, pooled)) if on else VALUED
    batch_evidence.Evidence.best = (lambda self, request, pooled, floor: list(floor)) if on else BEST


VALUED, BEST = batch_plan.BatchPlanning._valued_alpha, batch_evidence.Evidence.best


def run(args) -> dict:
    clock, target, prompts = workload(args)
    out = {}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        chosen = prompts[: batch * args.requests_per_slot]
        for name, arm in [(n, a) for n in args.drafters.split(",") for a in args.arms.split(",")]:
            _unconditioned(arm == "main")
            target.batch_realized, target.batch_pass_costs = {}, {}  # each arm learns from its own calls
            for _ in range(2):
                RECORDS.clear()
                start = clock()
                results = sf.generate_batch(
                    target, sf.create_drafter(name, target), chosen, args.max_new_tokens, max_batch=batch
                )
                seconds = clock() - start
            texts = [r.tokens for r in results]
            for record in RECORDS:
                record["accepted"] = accepted(
                    record.pop("tokens"), record.pop("parents"), texts[record["request"]][record["at"] :]
                )
            out[f"{name} {arm} B={batch}"] = list(RECORDS)
            passes, tokens = sum(r.metrics.target_passes for r in results), sum(map(len, texts))
            print(
                f"{name} {arm} B={batch}: {passes} passes, tau {tokens / passes:.3f}, {len(RECORDS)} proposals, "
                f"{sum(r['planned'] > 0 for r in RECORDS)} drafted, {seconds:.2f} s",
                file=sys.stderr,
            )
    return out


def show(data: dict) -> None:
    for arm, records in data.items():
        print(f"{arm}: {len(records)} proposals, {sum(r['planned'] > 0 for r in records)} drafted")
        groups = collections.defaultdict(list)
        for r in records:
            groups[(r["evidence"], r["planned"] > 0)].append(r)
        for (evidence, drafted), rs in sorted(groups.items()):
            a1 = sum(r["accepted"] >= 1 for r in rs) / len(rs)
            mean = sum(r["accepted"] for r in rs) / len(rs)
            used = [r["alpha1"][0] for r in rs if r["alpha1"]]
            print(
                f"  evidence {evidence:2d} {'drafted' if drafted else 'declined':8s} n={len(rs):4d} "
                f"accept@1={a1:.2f} mean accepted={mean:.2f} size={sum(r['size'] for r in rs) / len(rs):.1f} "
                f"alpha1 used={sum(used) / max(1, len(used)):.2f}"
            )


def main() -> None:
    if sys.argv[1] == "--show":
        show(json.loads(open(sys.argv[2]).read()))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch-sizes", default="4")
    parser.add_argument("--drafters", default="prompt_lookup,suffix")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--arms", default="main,evidence", help="main: drafts valued without their evidence")
    parser.add_argument("--json", default="evidence.json")
    args = parser.parse_args()
    _install()
    data = run(args)
    open(args.json, "w").write(json.dumps(data))
    show(data)


if __name__ == "__main__":
    main()
