"""Record every steady batched pass's plan beside what it measured, through the CLI (docs/batching.md, session 26).

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

from specfamily.core import batch_lengths

RECORDS: list[dict] = []


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
            "B": batch,
            "kind": kind,
            "gain": gain,
            "N": rows,
            "per_slot": per_slot,
            "tree": any(max(p.rows[:g], default=1) > 1 for p, g in zip(prospects, lengths, strict=True)),
            "correction": self.correction(batch),
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

    def timed_(self, batch, rows, steps, draft_seconds, seconds, slots=0.0, drafted=0.0):
        RECORDS.append({"event": "timed", "B": batch, "rows": rows, "draft": draft_seconds, "seconds": seconds})
        return timed(self, batch, rows, steps, draft_seconds, seconds, slots, drafted)

    def settled(self, committed, seconds):
        if self.predicted is not None:
            RECORDS.append({"event": "settle", "committed": list(committed), "seconds": seconds})
        return settle(self, committed, seconds)

    batch_lengths.LengthPolicy._plan = planned
    batch_lengths.LengthPolicy.timed = timed_
    batch_lengths.LengthPolicy.settle = settled


def passes(records: list[dict]) -> list[dict]:
    """Each plan joined with its pass's measurement (and, for a drafted one, what it committed)."""
    out, pending = [], None
    for record in records:
        if "kind" in record:
            pending = record
        elif record.get("event") == "timed" and pending is not None:
            out.append({**pending, "rows": record["rows"], "draft": record["draft"], "seconds": record["seconds"]})
            pending = None
        elif record.get("event") == "settle" and out:
            out[-1]["committed"] = record["committed"]
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
                f"measured={1e3 * p['seconds']:.1f} ms propose={1e3 * p['draft']:.1f} ms resting={p['resting']} "
                f"tokens={sum(p.get('committed', []))} rows a slot={p['per_slot']}"
            )


def main() -> None:
    if sys.argv[1] == "--show":
        show(json.loads(open(sys.argv[2]).read()))
        return
    out = sys.argv.pop(1)
    _install()
    atexit.register(lambda: open(out, "w").write(json.dumps(RECORDS)))
    from specfamily.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
