"""What ``batch_sweep.py`` measured and how it is shown: a method's row at one batch size, the sweep's record (its
JSON), the speed table with each cell's interval and the crossover, the ">= 0.98x" verdict, the passes table and the
plot of speedup against batch size."""

from __future__ import annotations

from dataclasses import dataclass, field

from common import paired_interval

from specfamily.eval.plots import line_style


@dataclass
class Row:
    """One method at one batch size."""

    method: str
    batch: int
    seconds: float  # median over rounds
    tokens: int  # new tokens over the batch
    mismatched: int = 0  # requests whose tokens differ from plain batched decoding's (drafters)
    latency: float = float("nan")  # median over rounds of the median request's latency, wall seconds (not hf)
    passes: int = 0  # target passes over the batch's requests, prefill included (last round; not hf)
    rounds: list[float] = field(default_factory=list)  # tokens/s over plain's in the same round, round by round
    round_taus: list[float] = field(default_factory=list)  # tau round by round (a policy may draft in some only)

    @property
    def tau(self) -> float:
        """New tokens per target pass over the requests (nan for hf, whose passes are not counted)."""
        return self.tokens / self.passes if self.passes else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Sweep:
    threads: int
    clock: str
    max_new_tokens: int
    matmul: str = "exact"
    max_prompt_tokens: int = 0  # 0: whole prompts
    per_category: int = 3
    prompt_tokens: list[int] = field(default_factory=list)  # each prompt's length, in order
    requests_per_slot: int = 1
    arrival_rate: float | None = None  # requests per second (None: all at once)
    rows: list[Row] = field(default_factory=list)
    pass_ratio: dict[int, float] = field(default_factory=dict)  # B -> t(B, 5) / t(B, 1)
    cache_bytes_per_request: int = 0  # at the capacity generate_batch preallocates for these prompts
    cache_capacity: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    plain_runs: int = 1  # plain's runs a round (their mean: the round's reference)
    hf_rounds: int | None = None  # the timed rounds hf ran in, the first ones (None: every one)
    categories: str | None = None  # the Spec-Bench categories kept, comma-separated (None: all)
    sampling: dict = field(default_factory=dict)  # SamplingConfig's fields ({} or temperature 0: greedy)

    def tps(self, method: str, batch: int) -> float | None:
        row = next((r for r in self.rows if r.method == method and r.batch == batch), None)
        return None if row is None else row.tokens_per_second

    def speedup(self, method: str, batch: int) -> float | None:
        ours, plain = self.tps(method, batch), self.tps("plain", batch)
        return None if ours is None or not plain else ours / plain

    def interval(self, method: str, batch: int) -> tuple[float, float] | None:
        """The 95% t interval of the mean per-round ratio to plain (:func:`paired_interval`), None for plain."""
        row = next((r for r in self.rows if r.method == method and r.batch == batch), None)
        return None if row is None or method == "plain" else paired_interval(row.rounds)

    def crossover(self, method: str, batches: list[int]) -> int | None:
        return next((b for b in batches if (s := self.speedup(method, b)) is not None and s < 1.0), None)


def table(result: Sweep, batches: list[int]) -> str:
    methods = [m for m in ("plain", "hf") if any(r.method == m for r in result.rows)]
    methods += [m for m in dict.fromkeys(r.method for r in result.rows) if m not in ("plain", "hf")]
    done = [b for b in batches if result.tps("plain", b) is not None]
    lines = ["| method | " + " | ".join(f"B={b}" for b in done) + " | crossover |",
             "| --- |" + " --- |" * (len(done) + 1)]
    for method in methods:
        cells = []
        for b in done:
            tps, ratio = result.tps(method, b), result.speedup(method, b)
            row = next((r for r in result.rows if r.method == method and r.batch == b), None)
            mark = f" ({row.mismatched} differ)" if row is not None and row.mismatched else ""
            if row is not None and result.arrival_rate is not None:
                mark += f", latency {row.latency:.2f} s"
            ci = result.interval(method, b)
            spread = "" if ci is None else f", {ci[0]:.2f}-{ci[1]:.2f}"
            cells.append("-" if tps is None else f"{tps:.1f} tok/s ({ratio:.2f}x{spread}){mark}")
        cross = "" if method == "plain" else str(result.crossover(method, done) or f"none up to {done[-1]}")
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {cross} |")
    lines.append("| t(B,5)/t(B,1) | " + " | ".join(f"{result.pass_ratio.get(b, float('nan')):.2f}" for b in done)
                 + " | |")
    return "\n".join(lines)


def floor_verdict(result: Sweep, batches: list[int], floor: float = 0.98) -> str:
    """Issue 33's goal "each drafter at its defaults >= ``floor`` x plain at every batch size", judged cell by cell
    on the 95% interval of its rounds' ratios: under (the whole interval below the floor: a measured loss), unsure
    (the median below, the interval reaching over: not told apart from the floor) or met."""
    under, unsure = [], []
    for row in result.rows:
        if row.method in ("plain", "hf") or row.batch not in batches:
            continue
        ratio, ci = result.speedup(row.method, row.batch), result.interval(row.method, row.batch)
        cell = f"{row.method} B={row.batch} {ratio:.3f}"
        if ci is not None and ci[1] < floor:
            under.append(f"{cell} ({ci[0]:.3f}-{ci[1]:.3f})")
        elif ratio < floor:
            unsure.append(cell if ci is None else f"{cell} ({ci[0]:.3f}-{ci[1]:.3f})")
    return (f">= {floor}x at every B: {'met' if not under and not unsure else 'not shown'}; measurably under "
            f"(interval below {floor}): {', '.join(under) or 'none'}; median under, interval reaching {floor}: "
            f"{', '.join(unsure) or 'none'}")


def passes_table(result: Sweep, batches: list[int]) -> str:
    """Each arm's target passes over its requests (prefill included) and tau in the last round, per batch size (hf has
    none), with the range of its rounds' taus where they differ (a cost-aware policy may draft in some rounds only)."""
    done = [b for b in batches if result.tps("plain", b) is not None]
    methods = [m for m in dict.fromkeys(r.method for r in result.rows) if m != "hf"]
    lines = ["| passes (tau) | " + " | ".join(f"B={b}" for b in done) + " |", "| --- |" + " --- |" * len(done)]
    for method in methods:
        rows = [next((r for r in result.rows if r.method == method and r.batch == b), None) for b in done]
        lines.append(f"| {method} | " + " | ".join("-" if r is None else _passes_cell(r) for r in rows) + " |")
    return "\n".join(lines)


def _passes_cell(row: Row) -> str:
    low, high = min(row.round_taus, default=row.tau), max(row.round_taus, default=row.tau)
    spread = f"; rounds {low:.2f}-{high:.2f}" if f"{low:.2f}" != f"{high:.2f}" else ""
    return f"{row.passes} ({row.tau:.2f}{spread})"


def plot(result: Sweep, batches: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = [method for method in dict.fromkeys(r.method for r in result.rows) if method != "plain"]
    for index, method in enumerate(methods):
        xs = [b for b in batches if result.speedup(method, b) is not None]
        ys = [result.speedup(method, b) for b in xs]
        (line,) = ax.plot(xs, ys, marker="o", label=method, linestyle=line_style(index))
        cross = result.crossover(method, xs)
        if cross is not None:
            ax.plot([cross], [result.speedup(method, cross)], marker="x", markersize=12, color=line.get_color())
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B (concurrent requests)")
    ax.set_ylabel("tokens/s relative to plain batched decoding")
    ax.set_title(f"speedup by load ({result.threads} thread(s), x = crossover)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
