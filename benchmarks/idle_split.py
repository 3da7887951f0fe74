"""Where a batch-1 run's time goes beyond plain decoding's, per drafter, read from a run's own trace
(``results.jsonl`` of ``specfamily ... trace=true``, the default): its passes priced at plain decoding's mean verify
seconds a pass plus its loop seconds a pass, and the seconds beyond that price split into the drafted passes (verify
plus draft, against one plain pass a token they committed), the idle passes' verify (over plain's mean a pass), the
idle passes' draft window (the policy's ``next_gamma`` and any proposal that came back empty) and the loop's other
seconds (over plain's a pass); each as a share of the price. Negative: a saving.

    python benchmarks/idle_split.py work/sampled-run-s27/results.jsonl small_model,rest,self_spec
"""

import json
import sys


def _passes(rows: list[dict]) -> tuple[float, int, float, float]:
    """(decode seconds, passes after the prefill, their verify seconds, their draft seconds) of ``rows``."""
    decode = sum(r["metrics"]["decode_seconds"] for r in rows)
    passes = sum(len(r["trace"]["verify_seconds"]) - 1 for r in rows)
    verify = sum(sum(r["trace"]["verify_seconds"][1:]) for r in rows)
    draft = sum(sum(r["trace"]["draft_seconds"][1:]) for r in rows)
    return decode, passes, verify, draft


def split(rows: list[dict], name: str) -> dict[str, float]:
    """``name``'s speedup over plain decoding (tokens per second) and its seconds beyond plain's price, each as a
    share of that price: ``drafted``, ``idle_verify``, ``idle_draft``, ``other``; ``drafted_passes``, ``passes``."""
    plain = [r for r in rows if r["drafter"] == "plain"]
    P, Pn, Pv, Pd = _passes(plain)
    per, loop = Pv / Pn, (P - Pv - Pd) / Pn
    mine = [r for r in rows if r["drafter"] == name]
    D, n, _, _ = _passes(mine)
    T = sum(r["metrics"]["new_tokens"] for r in mine)
    dv = ds = iv = ids = 0.0
    dn = 0
    for r in mine:
        t = r["trace"]
        for i in range(1, len(t["draft_tokens"])):
            if len(t["draft_tokens"][i]):
                dv, ds, dn = dv + t["verify_seconds"][i], ds + t["draft_seconds"][i], dn + 1
            else:
                iv, ids = iv + t["verify_seconds"][i], ids + t["draft_seconds"][i]
    price = T * (per + loop)
    return {
        "speedup": (T / D) / (sum(r["metrics"]["new_tokens"] for r in plain) / P),
        "drafted": (dv + ds - (T - (n - dn)) * per) / price,
        "idle_verify": (iv - (n - dn) * per) / price,
        "idle_draft": ids / price,
        "other": (D - dv - ds - iv - ids - n * loop) / price,
        "drafted_passes": dn,
        "passes": n,
    }


def main(path: str, names: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    for name in names.split(","):
        s = split(rows, name)
        print(
            f"{name}: speedup {s['speedup']:.3f}; beyond plain's price: drafted passes {100 * s['drafted']:+.2f}%, "
            f"idle verify {100 * s['idle_verify']:+.2f}%, idle draft window {100 * s['idle_draft']:+.2f}%, "
            f"loop other {100 * s['other']:+.2f}%; drafted {s['drafted_passes']} of {s['passes']} passes"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
