"""benchmarks/idle_split.py: a drafter's seconds beyond plain decoding's price, split by where they went."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from idle_split import split  # noqa: E402


def _row(
    drafter: str,
    drafts: list[int],
    accepted: list[int],
    verify: list[float],
    draft: list[float],
    decode: float,
    tokens: int,
) -> dict:
    trace = {
        "draft_tokens": [[0] * d for d in drafts],
        "accepted": [[0] * a for a in accepted],
        "verify_seconds": verify,
        "draft_seconds": draft,
    }
    return {"drafter": drafter, "trace": trace, "metrics": {"decode_seconds": decode, "new_tokens": tokens}}


def test_the_split_prices_each_part_against_plain_decoding():
    # plain: a prefill and 4 passes of 1.0 s verify, 0.1 s of loop each: 4.4 s for 4 tokens
    plain = _row("plain", [0] * 5, [0] * 5, [9.0, 1, 1, 1, 1], [0.0] * 5, 4.4, 4)
    # the drafter: a drafted pass (2 tokens accepted, 1.5 s verify, 0.2 s draft) and 2 idle passes (1.1 s verify,
    # 0.05 s in the draft window), 0.5 s of loop: 5 tokens in 4.0 s
    drafter = _row("d", [0, 3, 0, 0], [0, 2, 0, 0], [9.0, 1.5, 1.1, 1.1], [0.0, 0.2, 0.05, 0.05], 4.5, 5)
    s = split([plain, drafter], "d")
    price = 5 * 1.1
    assert s["speedup"] == pytest.approx((5 / 4.5) / (4 / 4.4))
    assert s["drafted"] == pytest.approx((1.7 - 3 * 1.0) / price)  # 3 tokens for 1.7 s: a saving
    assert s["idle_verify"] == pytest.approx(0.2 / price)
    assert s["idle_draft"] == pytest.approx(0.1 / price)
    assert s["other"] == pytest.approx((4.5 - 1.7 - 2.2 - 0.1 - 3 * 0.1) / price)
    assert (s["drafted_passes"], s["passes"]) == (1, 3)
