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


def main(path: str, names: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    plain = [r for r in rows if r["drafter"] == "plain"]
    P = sum(r["metrics"]["decode_seconds"] for r in plain)
    PT = sum(r["metrics"]["new_tokens"] for r in plain)
    Pn = sum(len(r["trace"]["verify_seconds"]) - 1 for r in plain)
    Pv = sum(sum(r["trace"]["verify_seconds"][1:]) for r in plain)
    per = Pv / Pn
    Po = (P - Pv - sum(sum(r["trace"]["draft_seconds"][1:]) for r in plain)) / Pn
    for name in names.split(","):
        rs = [r for r in rows if r["drafter"] == name]
        D = sum(r["metrics"]["decode_seconds"] for r in rs)
        T = sum(r["metrics"]["new_tokens"] for r in rs)
        n = sum(len(r["trace"]["verify_seconds"]) - 1 for r in rs)
        dv = ds = iv = ids = 0.0
        dn = 0
        for r in rs:
            t = r["trace"]
            for i in range(1, len(t["draft_tokens"])):
                if len(t["draft_tokens"][i]):
                    dv += t["verify_seconds"][i]
                    ds += t["draft_seconds"][i]
                    dn += 1
                else:
                    iv += t["verify_seconds"][i]
                    ids += t["draft_seconds"][i]
        other = D - dv - ds - iv - ids
        speedup = (T / D) / (PT / P)
        base = T * (per + Po)
        drafted = dv + ds - (T - (n - dn)) * per
        print(
            f"{name}: speedup {speedup:.3f} (tokens {T}, plain {PT}); beyond plain's price: drafted passes "
            f"{100 * drafted / base:+.2f}%, idle verify {100 * (iv - (n - dn) * per) / base:+.2f}%, idle draft window "
            f"{100 * ids / base:+.2f}%, loop other {100 * (other - n * Po) / base:+.2f}%; drafted {dn} of {n} passes"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
