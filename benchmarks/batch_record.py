"""Record every steady batched pass's plan beside what it measured, through the CLI (docs/batching-log.md, session 26).

    python benchmarks/batch_record.py rec.json hydra.run.dir=work/b8 batch_size=8 'drafter.names=[suffix]' \
        threads=2 progress=false plots=false noise.repeats=0
    python benchmarks/batch_record.py --show rec.json

Wraps ``LengthPolicy._plan``, ``timed`` and ``settle``: per plan its kind, predicted gain, correction, planned rows N
and rows a slot, tree or chain, the table's seconds at N with its draft rows' context term, how many measured passes
the (B, N) entry rests on and the N measured at B; per pass the measured seconds and the proposal and planning
seconds; per drafted pass the tokens each slot committed. ``--show`` prints the drafted passes, predicted against
measured.
"""

from __future__ import annotations

import atexit
import json
import statistics
import sys

from specfamily.core import batch_evidence, batch_lengths, batch_plan, theory

RECORDS: list[dict] = []
RUNS: dict[int, int] = {}  # a length policy's id -> the run it plans (in order of its first plan)
HELD: list[tuple[dict, list]] = []  # (a plan's record, its slots' (request, proposal) pairs): decided by :func:`decide`


def _install() -> None:
    plan, timed, settle = (
        batch_lengths.LengthPolicy._plan,
        batch_lengths.LengthPolicy.timed,
        batch_lengths.LengthPolicy.settle,
    )

    def planned(self, batch, prospects, proposed, together, decided=None):
        decided = decided or self._decide(batch, prospects, proposed, together)  # before the plan records it
        lengths = plan(self, batch, prospects, proposed, together, decided)
        _, gain, kind = decided
        per_slot = [sum(p.rows[:g]) for p, g in zip(prospects, lengths, strict=True)]
        rows = batch + sum(per_slot)
        record = {
            "run": RUNS.setdefault(id(self), len(RUNS)),  # one length policy a generate_batch call
            "B": batch,
            "kind": kind,
            "gain": gain,
            "N": rows,
            "per_slot": per_slot,
            "tree": any(max(p.rows[:g], default=1) > 1 for p, g in zip(prospects, lengths, strict=True)),
            "correction": self.correction(batch),
            "lengths": list(lengths),
            "acceptance": [list(p.acceptance) for p in prospects],
            "values": [p.value for p in prospects],
            "proposed": proposed,
        }
        seconds = self.costs.table(batch, rows, sum(p.context for p in prospects)) if any(lengths) else None
        if seconds is not None and rows < len(seconds):
            attended = sum(r * p.context for r, p in zip(per_slot, prospects, strict=True))
            record.update(
                predicted=seconds[rows] + self.costs.row_token() * attended,
                plain=seconds[batch],
                resting=len(self.costs.passes.get((batch, rows), ())),
                measured_at=sorted(n for b, n in self.costs.passes if b == batch),
            )
        RECORDS.append(record)
        return lengths

    def timed_(self, batch, rows, steps, draft_seconds, seconds, slots=0.0, drafted=0.0, host=None, after=0.0):
        RECORDS.append({"event": "timed", "B": batch, "rows": rows, "draft": draft_seconds, "seconds": seconds,
                        "host": host, "host_after": after})
        return timed(self, batch, rows, steps, draft_seconds, seconds, slots, drafted, host, after)

    def settled(self, committed, seconds):
        if self.predicted is None:
            return settle(self, committed, seconds)
        window = self.realized.get(self.predicted[0])
        before = window.passes[-1] if window is not None and window.passes else None
        out = settle(self, committed, seconds)
        window = self.realized.get(len(committed))
        after = window.passes[-1] if window is not None and window.passes else None
        record = {"event": "settle", "committed": list(committed), "seconds": seconds}
        if after is not None and after is not before:
            record.update(predicted_gain=after[0], realized_gain=after[1])
        RECORDS.append(record)
        return out

    def planned_drafts(self, group, gammas, drafts, c0):
        start = len(RECORDS)
        out = proposals(self, group, gammas, drafts, c0)
        plan = next((r for r in RECORDS[start:] if "kind" in r), None)  # planned on these drafts (lookahead)
        if plan is not None and any(len(d) for d in drafts):
            HELD.append(
                (
                    plan,
                    [
                        (r, batch_evidence.Proposal.of(d, len(r.new_tokens)) if len(d) else None, d.evidence)
                        for r, d in zip(group, drafts, strict=True)
                    ],
                )
            )
        return out

    proposals = batch_plan.BatchPlanning._planned
    batch_lengths.LengthPolicy._plan = planned
    batch_plan.BatchPlanning._planned = planned_drafts
    batch_lengths.LengthPolicy.timed = timed_
    batch_lengths.LengthPolicy.settle = settled


def decide() -> None:
    """Each held proposal's levels accepted drafted whole, read off its request's text once the run is over (greedy
    decoding: every proposal, drafted or not; ``batch_evidence.resolve``): the plan's record gets per slot
    (evidence, levels accepted whole or None where the text ended first) under ``accepted``."""
    for plan, slots in HELD:
        plan["accepted"] = [
            None if p is None else [e, (batch_evidence.resolve(p, r.new_tokens) or (None, None))[1]]
            for r, p, e in slots
        ]
    HELD.clear()


def passes(records: list[dict]) -> list[dict]:
    """Each plan joined with its pass's measurement (and, for a drafted one, what it committed)."""
    out, pending = [], None
    for record in records:
        if "kind" in record:
            pending = record
        elif record.get("event") == "timed" and pending is not None:
            out.append({**pending, "rows": record["rows"], "draft": record["draft"], "seconds": record["seconds"],
                        "host": record.get("host") or 0.0})
            pending = None
        elif record.get("event") == "settle" and out:
            out[-1]["committed"] = record["committed"]
            out[-1]["settled"] = record["seconds"]
            out[-1].update({k: record[k] for k in ("predicted_gain", "realized_gain") if k in record})
    return out


def show(records: list[dict]) -> None:
    joined = passes(records)
    for batch in sorted({p["B"] for p in joined}):
        at = [p for p in joined if p["B"] == batch]
        plain = [p["seconds"] for p in at if p["rows"] == batch]
        drafted = [p for p in at if p["rows"] > batch and "predicted" in p]
        head = f"B={batch}: {len(at)} passes, {len(drafted)} drafted and priced"
        print(head + (f", plain median {1e3 * statistics.median(plain):.1f} ms" if plain else ""))
        for p in drafted:
            print(
                f"  N={p['rows']:3d} {'tree' if p['tree'] else 'chain'} {p['kind']:5s} gain={p['gain']:.2f} "
                f"corr={p['correction']:.2f} predicted={1e3 * p['predicted']:.1f} ms "
                f"measured={1e3 * (p['seconds'] + p['host']):.1f} ms (host {1e3 * p['host']:.1f}) "
                f"propose={1e3 * p['draft']:.1f} ms resting={p['resting']} "
                f"tokens={sum(p.get('committed', []))} rows a slot={p['per_slot']}"
            )


def _reaches(acceptance: list[float], depth: int) -> float:
    """Expected levels accepted of a draft cut to ``depth`` with per-depth ``acceptance``."""
    return theory.expected_tokens_by_depth(acceptance, min(depth, len(acceptance))) - 1.0


def calibrate(records: list[dict]) -> dict:
    """Predicted against realized, by group: drafted passes' gains (sum realized / sum predicted), their valued
    tokens and seconds apart, and every proposal's accepted levels (drafted cut to its planned depth, declined whole;
    the acceptance the plan valued it at against what its text accepted)."""
    joined, out = passes(records), {"passes": {}, "proposals": {}}
    for p in joined:
        if "realized_gain" not in p:
            continue
        drafted = [i for i, g in enumerate(p["lengths"]) if g]
        buckets = [
            batch_evidence.bucket(p["accepted"][i][0]) for i in drafted if p.get("accepted") and p["accepted"][i]
        ]
        tokens = sum(
            v * (1 + _reaches(a, g)) for v, a, g in zip(p["values"], p["acceptance"], p["lengths"], strict=True)
        )
        keys = [("all",), ("kind", p["kind"]), ("depth", max(p["lengths"])), ("bucket", max(buckets, default=0))]
        for key in keys:
            group = out["passes"].setdefault(" ".join(map(str, key)), [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            group[0] += 1
            group[1] += p["predicted_gain"]
            group[2] += p["realized_gain"]
            group[3] += tokens
            group[4] += sum(v * c for v, c in zip(p["values"], p["committed"], strict=True))
            group[5] += p.get("predicted", 0.0)
            group[6] += p["settled"]
    for p in joined:
        for i, slot in enumerate(p.get("accepted") or []):
            if slot is None or slot[1] is None or not p["acceptance"][i]:
                continue
            evidence, whole = slot
            depth = p["lengths"][i] or len(p["acceptance"][i])
            name = f"{'drafted' if p['lengths'][i] else 'declined'} bucket {batch_evidence.bucket(evidence)}"
            for key in (name, "drafted" if p["lengths"][i] else "declined"):
                group = out["proposals"].setdefault(key, [0, 0.0, 0.0, 0.0, 0.0])
                group[0] += 1
                group[1] += p["acceptance"][i][0]
                group[2] += whole >= 1
                group[3] += _reaches(p["acceptance"][i], depth)
                group[4] += min(whole, depth)
    return out


def show_calibration(records: list[dict]) -> None:
    runs = sorted({r["run"] for r in records if "run" in r})
    for run in runs if len(runs) > 1 else []:
        print(f"run {run}:")
        _calibration(_of_run(records, run))
    print("all runs:" if len(runs) > 1 else "", end="\n" if len(runs) > 1 else "")
    _calibration(records)


def _of_run(records: list[dict], run: int) -> list[dict]:
    """The records of one run (a plan and the events after it up to the next plan belong to the plan's run)."""
    out, current = [], None
    for record in records:
        current = record.get("run", current)
        if current == run:
            out.append(record)
    return out


def _calibration(records: list[dict]) -> None:
    table = calibrate(records)
    print(
        "drafted passes: n, gain predicted -> realized (ratio), valued tokens predicted -> committed, "
        "seconds priced -> measured (plan, proposal, pass)"
    )
    for key, (n, pg, rg, pt, rt, ps, rs) in sorted(table["passes"].items()):
        print(
            f"  {key:12s} n={n:4d} gain {pg / n:.3f} -> {rg / n:.3f} ({rg / pg:.3f}) tokens {pt / n:.2f} -> "
            f"{rt / n:.2f} ({rt / pt:.3f}) ms {1e3 * ps / n:.1f} -> {1e3 * rs / n:.1f} ({ps / rs if rs else 0:.3f})"
        )
    print(
        "proposals: n, depth-1 acceptance valued -> accepted, levels accepted (drafted: to its planned depth; "
        "declined: whole) expected -> accepted"
    )
    for key, (n, a1, r1, pe, re) in sorted(table["proposals"].items()):
        print(f"  {key:20s} n={n:4d} alpha1 {a1 / n:.3f} -> {r1 / n:.3f}  levels {pe / n:.2f} -> {re / n:.2f}")


def main() -> None:
    if sys.argv[1] == "--show":
        show(json.loads(open(sys.argv[2]).read()))
        return
    if sys.argv[1] == "--calibration":
        show_calibration(json.loads(open(sys.argv[2]).read()))
        return
    out = sys.argv.pop(1)
    _install()
    atexit.register(lambda: (decide(), open(out, "w").write(json.dumps(RECORDS))))
    from specfamily.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
