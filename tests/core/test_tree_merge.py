"""core/tree_merge.py: the merged trie, its node mapping, and the law of the first committed token, computed exactly
by enumerating every pair of draws and the verifier's rule for each merged draft."""

from __future__ import annotations

import itertools

import pytest
import torch

from specfamily.core.tree_merge import Source, conditional_row, merge_drafts
from specfamily.core.types import Draft

V = 5
P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
QA = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)
QB = torch.tensor([0.05, 0.15, 0.50, 0.10, 0.20], dtype=torch.float64)


def test_shared_prefixes_are_laid_once_and_each_part_knows_where_its_nodes_went():
    a = Draft([3, 4, 5], [-1, 0, 0])
    b = Draft([3, 4, 6, 7], [-1, 0, 1, -1])
    merged = merge_drafts([a, b], 8)
    assert merged.draft.tokens.tolist() == [3, 4, 5, 6, 7]
    assert merged.draft.parents.tolist() == [-1, 0, 0, 1, -1]
    assert merged.draft.q is None  # every part deterministic
    assert merged.at == [[0, 1, 2], [0, 1, 3, 4]]
    assert merged.sources[3] == Source(1, 2, ()) and merged.sources[4] == Source(1, 3, (3,))
    assert merged.part_path(1, [0, 1, 3]) == [0, 1, 2]
    assert merged.part_path(0, [0, 1, 3]) == [0, 1]  # a's tree stops at node 1
    assert merged.part_path(0, [4]) == [] and merged.part_path(1, [4]) == [3]


def test_a_new_sampled_node_reports_its_row_without_the_tokens_already_there():
    qa, qb = QA.expand(1, V), QB.expand(2, V)
    merged = merge_drafts([Draft([1], [-1], qa), Draft([1, 2], [-1, 0], qb)], V)
    assert merged.draft.tokens.tolist() == [1, 2] and merged.draft.parents.tolist() == [-1, 0]
    assert torch.equal(merged.draft.q[0], QA)  # laid first by a: a's row, not b's
    assert torch.equal(merged.draft.q[1], QB)  # first child of node 0: nothing to exclude
    merged = merge_drafts([Draft([1], [-1], qa), Draft([2], [-1], qb[:1])], V)
    assert torch.allclose(merged.draft.q[1], conditional_row(QB, [1]))
    assert merged.draft.q[1, 1] == 0 and float(merged.draft.q[1].sum()) == pytest.approx(1.0)


def test_deterministic_nodes_become_one_hot_rows_when_another_part_reports_q():
    merged = merge_drafts([Draft([4], [-1]), Draft([4, 0], [-1, -1], QB.expand(2, V))], V)
    q = merged.draft.q
    assert merged.draft.tokens.tolist() == [4, 0]
    assert q[0].tolist() == [0, 0, 0, 0, 1.0]  # b's 4 merged into a's deterministic node
    assert torch.allclose(q[1], conditional_row(QB, [4]))


def _first_token_law(p: torch.Tensor, draft: Draft) -> torch.Tensor:
    """The exact law of the first committed token under the verifier's rule for the root's children."""
    residual, law, stay = p.clone(), torch.zeros_like(p), 1.0
    children = [i for i, parent in enumerate(draft.parents.tolist()) if parent < 0]
    for child in children:
        token = int(draft.tokens[child])
        q_row = torch.nn.functional.one_hot(torch.tensor(token), V).double() if draft.q is None else draft.q[child]
        accept = min(1.0, float(residual[token] / q_row[token]))
        law[token] += stay * accept
        stay *= 1 - accept
        rejected = torch.clamp(residual - q_row, min=0)
        residual = rejected / rejected.sum() if rejected.sum() > 0 else residual
    return law + stay * residual


def _merged_law(laws: list[torch.Tensor | None], tokens: list[int | None], rows_of=None) -> torch.Tensor:
    """E over every part's draw (a sampled part draws one root child from its law, a deterministic one proposes its
    token) of the first committed token's law under the merged draft; ``rows_of`` rewrites the merged q (a rogue)."""
    choices = [range(V) if law is not None else [token] for law, token in zip(laws, tokens, strict=True)]
    total = torch.zeros(V, dtype=torch.float64)
    for draws in itertools.product(*choices):
        weight = 1.0
        drafts = []
        for law, x in zip(laws, draws, strict=True):
            weight *= 1.0 if law is None else float(law[x])
            drafts.append(Draft([x], [-1], None if law is None else law.expand(1, V)))
        merged = merge_drafts(drafts, V)
        draft = merged.draft if rows_of is None else rows_of(merged, drafts)
        total += weight * _first_token_law(P, draft)
    return total


@pytest.mark.parametrize(("laws", "tokens"), [
    ([QA, QB], [None, None]),  # two sampled parts
    ([QA, QA], [None, None]),  # the same law twice
    ([None, QB], [2, None]),  # a deterministic proposal, then a sampled one
    ([QA, None], [None, 2]),  # a sampled one, then a deterministic one
    ([QA, None, QB], [None, 0, None]),
], ids=["sampled-sampled", "same-law", "det-sampled", "sampled-det", "three"])
def test_the_merge_is_exact(laws, tokens):
    assert torch.allclose(_merged_law(laws, tokens), P, atol=1e-12, rtol=0)


def test_reporting_the_later_part_s_row_for_a_shared_node_is_not_exact():
    """The rogue of specfamily.testing: a node both parts drew reports the row of the last part that landed on it."""
    def last_writer(merged, drafts):
        q = merged.draft.q.clone()
        for k, draft in enumerate(drafts):
            for i, node in enumerate(merged.at[k]):
                if merged.sources[node].part != k and draft.q is not None:
                    q[node] = draft.q[i]
        return Draft(merged.draft.tokens, merged.draft.parents, q)

    wrong = _merged_law([None, QB], [2, None], last_writer)
    assert (wrong - P).abs().sum() / 2 > 0.03  # total variation


def test_dropping_the_exclusion_is_not_exact():
    def unconditioned(merged, drafts):
        q = merged.draft.q.clone()
        for node, source in enumerate(merged.sources):
            if drafts[source.part].q is not None:
                q[node] = drafts[source.part].q[source.node]
        return Draft(merged.draft.tokens, merged.draft.parents, q)

    wrong = _merged_law([QA, QB], [None, None], unconditioned)
    assert (wrong - P).abs().sum() / 2 > 0.01

