"""Where a decode pass's time goes, per drafter arm: the policy's decision, the proposal (a merge's parts and its
trie apart), the target's pass, the policy's update, the observation (a merge's parts apart) and the rest of the
loop (verification, commit, bookkeeping: a request's time less the timed parts).

``TargetTap`` wraps the shared target's ``forward`` (and ``merge_drafts`` where the merge calls it) once and books
each call to the arm whose request is running; ``Breakdown.attach`` wraps one drafter object's methods. Passes are
classed by what was drafted: ``plain`` (nothing), ``drafted``; for a merge, by which parts drafted
(``suffix``, ``eagle3``, ``suffix+eagle3``). For a merge's passes where a later part drafted, ``marginal`` counts the
tokens the merged path accepted beyond what the first part alone would have had accepted (exact at temperature 0).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

import torch


class TargetTap:
    """Books the target's passes (and the merge's trie building) to the active :class:`Breakdown`."""

    def __init__(self, target, clock: Callable[[], float]) -> None:
        self.active: Breakdown | None = None
        self.clock = clock
        forward = target.forward

        def timed_forward(pending, draft=None, features=False):
            start = clock()
            out = forward(pending, draft, features=features)
            if self.active is not None:
                self.active.new_pass(clock() - start, 0 if draft is None else len(draft), bool(features), len(pending))
            return out

        target.forward = timed_forward
        import specfamily.drafters.merge.drafter as merge_module

        merge = merge_module.merge_drafts

        def timed_merge(drafts, vocab_size):
            start = clock()
            out = merge(drafts, vocab_size)
            if self.active is not None:
                self.active.book("merge_drafts", clock() - start)
            return out

        merge_module.merge_drafts = timed_merge


class Breakdown:
    """One arm's per-pass times, over every request it served."""

    def __init__(self, clock: Callable[[], float], tap: TargetTap) -> None:
        self.clock, self.tap = clock, tap
        self.rows: list[dict] = []
        self.pending: dict[str, float] = defaultdict(float)
        self.current: dict | None = None
        self.request_seconds = 0.0
        self.requests = 0
        self.parts: list[str] = []

    def begin_request(self) -> None:
        self.tap.active, self.current = self, None
        self.pending = defaultdict(float)

    def end_request(self, seconds: float) -> None:
        self.tap.active = None
        self.request_seconds += seconds
        self.requests += 1

    def book(self, name: str, seconds: float) -> None:
        """Time before the pass's forward goes to the coming pass; after it, to the pass just made."""
        target = self.pending if self.current is None or name in ("next_gamma", "propose", "merge_drafts") \
            or name.startswith("propose:") else self.current
        target[name] = target.get(name, 0.0) + seconds

    def new_pass(self, seconds: float, size: int, features: bool, fed: int) -> None:
        row = {**self.pending, "forward": seconds, "size": size, "features": features}
        row.setdefault("kind", "drafted" if size else "plain")
        if fed > 1:
            row["kind"] = "prefill"  # the prompt's pass (a draft may ride on it)
        self.rows.append(row)
        self.current, self.pending = row, defaultdict(float)

    def attach(self, target, drafter) -> None:
        if drafter is None:
            return
        self._wrap(drafter.policy, "next_gamma", "next_gamma")
        self._wrap(drafter.policy, "update", "update")
        self._wrap(drafter.policy, "timed", "timed")
        if hasattr(drafter.policy, "report_parts"):
            self._wrap(drafter.policy, "report_parts", "report_parts")
        self._wrap(drafter, "observe", "observe", before=self._merge_paths if hasattr(drafter, "parts") else None)
        self._wrap(drafter, "propose", "propose", after=self._merge_kind if hasattr(drafter, "parts") else None)
        for name, part in zip(getattr(drafter, "names", []), getattr(drafter, "parts", []), strict=True):
            self.parts = list(drafter.names)
            self._wrap(part, "propose", f"propose:{name}")
            self._wrap(part, "observe", f"observe:{name}")
        self.drafter = drafter

    def _wrap(self, owner, method: str, name: str, before=None, after=None) -> None:
        inner = getattr(owner, method)
        clock = self.clock

        def timed(*args, **kwargs):
            if before is not None:
                before(*args)
            start = clock()
            out = inner(*args, **kwargs)
            self.book(name, clock() - start)
            if after is not None:
                after(out)
            return out

        setattr(owner, method, timed)

    def _merge_kind(self, draft) -> None:
        drafted = [name for name, own in zip(self.parts, self.drafter.passes, strict=True) if len(own.draft)]
        self.pending["kind"] = "+".join(drafted) or "plain"
        self.pending["part_sizes"] = [len(own.draft) for own in self.drafter.passes]

    def _merge_paths(self, outcome) -> None:
        merged = self.drafter.last
        if merged is None or self.current is None:
            return
        first = len(merged.part_path(0, outcome.accepted_nodes))
        self.current["accepted"] = len(outcome.accepted_nodes)
        self.current["marginal"] = len(outcome.accepted_nodes) - first

    def report(self) -> dict:
        """Per pass kind: passes, mean milliseconds of each timed part, the merged path's marginal tokens; and the
        loop's rest (request time less every timed part) per pass."""
        kinds: dict[str, list[dict]] = defaultdict(list)
        for row in self.rows:
            kinds[row["kind"]].append(row)
        timed = sum(v for row in self.rows for k, v in row.items() if isinstance(v, float))
        out = {"passes": len(self.rows), "requests": self.requests,
               "rest_ms_per_pass": round(1e3 * (self.request_seconds - timed) / max(len(self.rows), 1), 3)}
        for kind, rows in sorted(kinds.items()):
            names = sorted({k for row in rows for k, v in row.items() if isinstance(v, float)})
            entry = {"passes": len(rows), "mean_size": round(statistics.mean(r["size"] for r in rows), 2)}
            entry.update({f"{k}_ms": round(1e3 * sum(r.get(k, 0.0) for r in rows) / len(rows), 3) for k in names})
            if any("marginal" in r for r in rows):
                entry["marginal_tokens"] = sum(r.get("marginal", 0) for r in rows)
                entry["accepted_tokens"] = sum(r.get("accepted", 0) for r in rows)
            out[kind] = entry
        return out

    @staticmethod
    def feature_cost(target, prompt: list[int], layers: tuple[int, ...], clock: Callable[[], float],
                     repeats: int = 200) -> dict:
        """One-token passes with and without the ``layers`` features, interleaved (ms, medians): what requesting the
        features costs the target on a pass that drafts nothing."""
        target.reset()
        out = target.forward(torch.tensor(prompt, dtype=torch.long))
        target.commit([])
        token = int(out.logits[-1].argmax())
        times: dict[str, list[float]] = {"none": [], "layers": []}
        for i in range(repeats):
            for key, features in (("none", False), ("layers", layers))[:: 1 if i % 2 else -1]:
                start = clock()
                out = target.forward(torch.tensor([token], dtype=torch.long), None, features=features)
                target.commit([])
                times[key].append(clock() - start)
                token = int(out.logits[-1].argmax())
        target.reset()
        med = {key: statistics.median(value) for key, value in times.items()}
        return {"layers": list(layers), "none_ms": round(1e3 * med["none"], 3),
                "layers_ms": round(1e3 * med["layers"], 3), "ratio": round(med["layers"] / med["none"], 4)}
