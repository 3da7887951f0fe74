"""Paired timing, the bottom layer of the benchmark scripts: the rows to measure, their results, and the schedule.

A row (``Method``) is our side against theirs, and for a drafter row our plain decoding beside them. Every side
runs on every prompt before the next prompt starts (ours, plain, theirs for prompt 1; then prompt 2; ...), the
order rotating by one each prompt and each repeat, so a drift in the machine's speed reaches every side alike and
each ratio comes from measurements taken seconds apart. A ratio is taken per repeat over all the prompts (theirs'
time / ours' time per new token; > 1: ours is faster); the table shows its median and range over the repeats.

Fresh state: ``Method.ours`` builds our side, with new drafter objects, once for the warm-up and once per timed
repeat. A drafter keeps state across the requests one object serves (suffix's global cache holds earlier answers;
the cost-aware policy's estimates carry over), so serving the warm-up prompt, or the previous repeat's prompts,
with the object then timed would time a drafter that has seen the timed prompt and its answer, which no user's
drafter has. Within a repeat one object serves every prompt in turn, each once, as a server's drafter serves its
requests; each repeat is one more run of that from the start. Our plain decoding keeps no state across calls, nor
do transformers' sides at the settings used here (``generate`` copies the assistant's generation config per call,
so its confidence threshold adapts within a call; only a "heuristic" schedule would write its draft length back).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class Output:
    """What one of our runs returned: new tokens and target passes (for tau)."""

    tokens: list[int]
    passes: int


OursFn = Callable[[list[int]], Output]
OursFactory = Callable[[], OursFn]  # a new side: new drafter objects each call
TheirsFn = Callable[[list[int]], list[int]]


def stateless(fn: OursFn) -> OursFactory:
    """A side that keeps nothing across requests (plain decoding, a bare loop) as a factory: the same callable."""
    return lambda: fn


@dataclass
class Method:
    """One row to measure: our side (``ours()`` builds it afresh, see the module docstring) against theirs, and
    our plain decoding (``plain``) timed beside them for a drafter row."""

    name: str
    ours: OursFactory
    theirs: TheirsFn
    theirs_label: str
    note: str = ""
    plain: OursFn | None = None


@dataclass
class Skipped:
    """A method that could not be measured, and why."""

    name: str
    reason: str


@dataclass
class Mismatch:
    """The first differing position between two outputs for one prompt."""

    prompt: int
    position: int
    ours: int | None  # None: ours ended there
    other: int | None
    against: str  # "theirs" or "reference" (plain greedy transformers)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


@dataclass
class PairResult:
    """One measured row; times are ms per new token, one entry per repeat (``plain_ms``: our plain decoding,
    timed beside a drafter row; empty for the others)."""

    name: str
    theirs_label: str
    ours_ms: list[float]
    theirs_ms: list[float]
    tau: float
    new_tokens: int  # per repeat, ours
    mismatches: list[Mismatch] = field(default_factory=list)
    note: str = ""
    plain_ms: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [t / o for o, t in zip(self.ours_ms, self.theirs_ms, strict=True)]

    @property
    def speedups(self) -> list[float]:
        """Our plain decoding's time / ours per repeat (> 1: the drafter pays); empty without ``plain_ms``."""
        return [p / o for o, p in zip(self.ours_ms, self.plain_ms, strict=True)]

    @property
    def identical(self) -> bool:
        return not self.mismatches

    def summary(self) -> dict:
        """JSON-friendly: the raw lists plus medians and ranges."""
        data = asdict(self)
        ratio = _spread(self.ratios)
        data.update(
            ours_ms_median=statistics.median(self.ours_ms),
            theirs_ms_median=statistics.median(self.theirs_ms),
            ratio_median=ratio["median"], ratio_min=ratio["min"], ratio_max=ratio["max"],
            identical=self.identical,
        )
        if self.plain_ms:
            speedup = _spread(self.speedups)
            data.update(plain_ms_median=statistics.median(self.plain_ms), speedup_median=speedup["median"],
                        speedup_min=speedup["min"], speedup_max=speedup["max"])
        return data


def first_mismatch(ours: Sequence[int], other: Sequence[int]) -> tuple[int, int | None, int | None] | None:
    """(position, ours' token, other's token) at the first difference, None when equal."""
    for position, (a, b) in enumerate(zip(ours, other, strict=False)):
        if a != b:
            return position, a, b
    if len(ours) == len(other):
        return None
    position = min(len(ours), len(other))
    pick = lambda seq: seq[position] if position < len(seq) else None  # noqa: E731
    return position, pick(ours), pick(other)


def _record(mismatches: list[Mismatch], prompt: int, ours: list[int], other: list[int], against: str) -> None:
    found = first_mismatch(ours, other)
    if found is None:
        return
    if any(m.prompt == prompt and m.against == against for m in mismatches):
        return  # one entry per prompt and comparison is enough
    mismatches.append(Mismatch(prompt, found[0], found[1], found[2], against))


@dataclass
class Tally:
    """One side's sums over one repeat."""

    seconds: float = 0.0
    tokens: int = 0
    passes: int = 0

    def add(self, seconds: float, out: Output) -> None:
        self.seconds += seconds
        self.tokens += len(out.tokens)
        self.passes += out.passes

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / max(self.tokens, 1)


def _as_output(fn: TheirsFn) -> OursFn:
    return lambda prompt: (lambda tokens: Output(tokens, len(tokens)))(fn(prompt))


def _sides(method: Method, ours: OursFn) -> dict[str, OursFn]:
    """The sides of one repeat, in their base order: ours, our plain decoding (drafter rows), theirs."""
    sides = {"ours": ours}
    if method.plain is not None:
        sides["plain"] = method.plain
    sides["theirs"] = _as_output(method.theirs)
    return sides


def run_repeat(sides: dict[str, OursFn], prompts: list[list[int]], shift: int, clock: Callable[[], float],
               check: Callable[[int, dict[str, list[int]]], None]) -> dict[str, Tally]:
    """Every side on prompt 1, then every side on prompt 2, ...; the order rotates by one per prompt from
    ``shift``. ``check(prompt index, outputs by side)`` sees each prompt's outputs."""
    names = list(sides)
    tallies = {name: Tally() for name in names}
    for i, prompt in enumerate(prompts):
        k = (shift + i) % len(names)
        outputs = {}
        for name in names[k:] + names[:k]:
            start = clock()
            out = sides[name](prompt)
            tallies[name].add(clock() - start, out)
            outputs[name] = out.tokens
        check(i, outputs)
    return tallies


def measure_pair(
    method: Method,
    prompts: list[list[int]],
    repeats: int,
    clock: Callable[[], float],
    reference: list[list[int]] | None = None,
    warmup: int = 1,
) -> PairResult:
    """Warm every side up (ours on a side of its own) on the first ``warmup`` prompts, then ``repeats`` timed
    passes over every prompt, each with our side built afresh (module docstring)."""
    warm = _sides(method, method.ours())
    for prompt in prompts[:warmup]:
        for side in warm.values():
            side(prompt)
    del warm  # its drafter is not timed: free it (a small_model drafter holds a draft Target of its own)
    mismatches: list[Mismatch] = []

    def check(i: int, outputs: dict[str, list[int]]) -> None:
        _record(mismatches, i, outputs["ours"], outputs["theirs"], "theirs")
        if reference is not None:
            _record(mismatches, i, outputs["ours"], reference[i], "reference")

    rounds = [run_repeat(_sides(method, method.ours()), prompts, repeat, clock, check) for repeat in range(repeats)]
    ours = rounds[-1]["ours"]
    tau = ours.tokens / ours.passes if ours.passes else float("nan")
    plain_ms = [r["plain"].ms_per_token for r in rounds] if method.plain is not None else []
    return PairResult(method.name, method.theirs_label, [r["ours"].ms_per_token for r in rounds],
                      [r["theirs"].ms_per_token for r in rounds], tau, ours.tokens, mismatches, method.note, plain_ms)
