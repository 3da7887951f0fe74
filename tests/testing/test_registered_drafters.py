"""Every registered drafter, in chain and tree modes, under the three sampling configs, verified to depth 3.

The default suite runs each case under one of the three configs, rotating down the list of cases so that every
config meets chains and trees and several families (:func:`rotated`); ``pytest -m slow`` runs the other two too.

Each case drafts depth 3 (gamma 3); the conformance run asserts the verifier tried depth-3 nodes and that the
drafts were trees in tree mode and chains in chain mode. Feature drafters (Medusa, EAGLE) draft from their second
pass on (the prefill is their warm-up); the 5 generated tokens leave a depth-3 draft and its bonus position.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

import specfamily as sf
from specfamily.drafters.rest.datastore import build_datastore
from specfamily.testing import SAMPLING_MATRIX, assert_lossless, draft_model_for, tiny_target
from specfamily.testing.conformance import PROMPT

DEPTH = 3
SAMPLING_IDS = ["t1", "t07-top_p09", "top_k5"]


def medusa_tree(widths: tuple[int, ...] = (8, 4, 2)) -> list[tuple[int, ...]]:
    """Rank paths of a depth-3 tree: all 8 depth-1 ranks, the top 4 below each, the top 2 below those (104 nodes):
    random heads cover the flat tiny target well enough that about a third of its drafts are verified 3 deep."""
    levels = [itertools.product(*(range(w) for w in widths[:depth])) for depth in range(1, len(widths) + 1)]
    return [tuple(path) for level in levels for path in level]


@functools.cache
def lookup_prompts() -> dict[str, tuple[int, ...]]:
    """Repetitive prompts for prompt lookup: ``base + g + base`` makes it copy g after the final ``base``; g is
    the 3-token continuation the tiny target is most likely to accept there (by exact probability). With a second
    continuation h (another first token), ``base + g + base + h + base`` gives two branches."""
    target, base = tiny_target("llama"), list(PROMPT)
    vocab = target.vocab_size
    paths = torch.tensor(list(itertools.product(range(vocab), repeat=DEPTH)))  # (V^3, 3)
    ids = torch.cat([torch.tensor(base).expand(len(paths), -1), paths, torch.tensor(base).expand(len(paths), -1),
                     paths], dim=1)
    with torch.inference_mode():
        probs = torch.softmax(target.model(input_ids=ids).logits[:, -DEPTH - 1 : -1].double(), dim=-1)
    accept = probs.gather(2, paths[:, :, None]).squeeze(2).prod(dim=1)  # (V^3,)
    order = accept.argsort(descending=True).tolist()
    g = paths[order[0]].tolist()
    h = next(paths[i].tolist() for i in order if paths[i, 0] != g[0])
    return {"chain": tuple(base + g + base), "tree": tuple(base + g + base + h + base)}


@functools.cache
def rest_datastore(vocab_size: int) -> str:
    """A datastore in which the kit's prompt is followed by prompt lookup's two best continuations: a tree."""
    tree = list(lookup_prompts()["tree"])
    base = list(PROMPT)
    g, h = tree[len(base) : len(base) + DEPTH], tree[2 * len(base) + DEPTH : 2 * len(base) + 2 * DEPTH]
    return str(build_datastore([base + g, base + h], tempfile.mkdtemp(prefix="rest-"), vocab_size, progress=False))


@dataclass(frozen=True)
class Case:
    name: str
    mode: str
    options: dict = field(default_factory=dict, hash=False)
    prompt: Callable[[], tuple[int, ...]] = lambda: PROMPT

    def __str__(self) -> str:
        return f"{self.name}-{self.mode}"

    def factory(self, target):
        options = dict(self.options)
        if self.name == "small_model":
            options["model"] = draft_model_for(target)
        if self.name == "rest":
            options["datastore"] = rest_datastore(target.vocab_size)
        return sf.create_drafter(self.name, target, **options)


CASES = [
    Case("small_model", "chain", {"gamma": DEPTH}),
    Case("prompt_lookup", "chain", {"gamma": DEPTH, "branches": 1}, lambda: lookup_prompts()["chain"]),
    Case("prompt_lookup", "tree", {"gamma": DEPTH, "branches": 3}, lambda: lookup_prompts()["tree"]),
    Case("self_spec", "chain", {"skip": ["mlp:1"], "gamma": DEPTH}),
    Case("medusa", "tree", {"weights": "random", "gamma": DEPTH, "tree": medusa_tree()}),
    Case("medusa", "chain", {"weights": "random", "gamma": DEPTH, "tree": "chain"}),
    Case("eagle", "tree", {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30}),
    Case("eagle", "chain", {"weights": "random", "gamma": DEPTH, "mode": "chain"}),
    Case("eagle3", "tree", {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30}),
    Case("eagle3", "chain", {"weights": "random", "gamma": DEPTH, "mode": "chain"}),
    Case("suffix", "chain", {"gamma": DEPTH, "mode": "chain"}, lambda: lookup_prompts()["chain"]),
    Case("suffix", "tree", {"gamma": DEPTH, "max_spec_factor": 2.0}, lambda: lookup_prompts()["tree"]),
    Case("merge", "tree", {"gamma": DEPTH, "parts": ["eagle3", "self_spec"], "options": {
        "eagle3": {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30, "tree_sampling": "sampled"},
        "self_spec": {"skip": ["mlp:1"], "gamma": DEPTH}}}),  # every node sampled: q given the earlier siblings
    Case("recycling", "tree", {"gamma": DEPTH, "max_tree_size": 12, "template": "2.2.2"}),
    Case("rest", "tree", {"gamma": DEPTH}),
    Case("hydra", "tree", {"weights": "random", "gamma": DEPTH, "tree": medusa_tree()}),
    Case("hydra", "chain", {"weights": "random", "gamma": DEPTH, "tree": "chain"}),
    Case("lookahead", "chain", {"gamma": DEPTH, "guesses": 1, "window": 4, "ngram": 4},
         lambda: lookup_prompts()["chain"]),
    Case("lookahead", "tree", {"gamma": DEPTH, "guesses": 3, "window": 4, "ngram": 4},
         lambda: lookup_prompts()["tree"]),
]
PRUNED = (0, 2, 3, 5, 6)  # a reduced draft vocabulary: q is zero on 1, 4 and 7, which only the target proposes
PRUNED_CASES = [
    Case("eagle", "tree", {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30,
                           "draft_vocab": list(PRUNED)}),
    Case("eagle", "chain", {"weights": "random", "gamma": DEPTH, "mode": "chain", "draft_vocab": list(PRUNED)}),
    Case("eagle3", "tree", {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30,
                            "draft_vocab": list(PRUNED)}),
    Case("eagle3", "chain", {"weights": "random", "gamma": DEPTH, "mode": "chain", "draft_vocab": list(PRUNED)}),
]

# EAGLE trees with children drawn without replacement (tree_sampling="sampled"): every node reports a q, so these
# are held to depth 3 in every config (300-sample pilots not needed: the runs measured depth-3 shares .81/.52/.30
# (eagle) and .82/.63/.52 (eagle3) at t1, t07-top_p09, top_k5, power at depth 3 >= 0.94 at the kit's sizes).
SAMPLED_TREE_CASES = [
    Case("eagle", "tree", {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30,
                           "tree_sampling": "sampled"}),
    Case("eagle3", "tree", {"weights": "random", "gamma": DEPTH, "top_k": 4, "total_tokens": 30,
                            "tree_sampling": "sampled"}),
]

# The depth each case's run must have power 0.9 at (against an error of TV 0.1 in the tokens decided at that level),
# per sampling config (t1, t07-top_p09, top_k5): the deepest depth that a share >= 0.6 of samples reaches, measured
# with 300-sample pilots (share at depths 1, 2, 3 in the comments), so the kit's own pilot sizes each run from its
# default (1389) to at most ~1900 samples and never has to sharpen the target (asking these cases for depth 3
# everywhere would: a slow test below asks it of the drafters that report a sampled q). Random heads on
# the 8-token tiny target rarely reach depth 3; deterministic drafts (q = None: prompt lookup, suffix, Medusa and
# EAGLE trees) have no q to misreport at any depth, and their acceptance is bounded by the target's own p(x). The
# depth-3 commit path is held to power 0.9 by self_spec and small_model (chains) and Medusa (tree, top-k 5); the slow
# test below holds the drafters that report a sampled q to depth 3.
MIN_DEPTH = {
    "small_model-chain": (3, 2, 2),  # d3 .74 .56 .42
    "prompt_lookup-chain": (1, 1, 1),  # d2 .34 .38 .46
    "prompt_lookup-tree": (1, 1, 2),  # d2 .53 .59 .66
    "self_spec-chain": (3, 3, 3),  # d3 1.0 .99 .96
    "medusa-tree": (2, 2, 3),  # d3 .56 .57 .68
    "medusa-chain": (1, 1, 1),  # d2 .30 .37 .42
    "hydra-tree": (2, 2, 3),  # random Hydra heads propose what random Medusa heads do (tests/drafters/test_hydra.py)
    "hydra-chain": (1, 1, 1),
    "eagle-tree": (2, 2, 2),  # d2 .75 .74 .73, d3 .04
    "eagle-chain": (3, 2, 2),  # d3 .63 .37 .21
    "eagle3-tree": (2, 2, 2),  # d2 .80 .79 .82, d3 .07-.14
    "eagle3-chain": (3, 2, 2),  # d3 .64 .45 .39
    "suffix-chain": (1, 1, 1),  # d2 .28 .32 .31
    "suffix-tree": (1, 1, 1),  # d2 .41 .51 .57
    "merge-tree": (3, 3, 3),
    "rest-tree": (1, 1, 1),  # the datastore's two continuations of the prompt, as prompt lookup's tree (no pilot)
    "recycling-tree": (2, 2, 2),  # the table learns the tiny target's successors over the samples (no pilot run)
    "lookahead-chain": (1, 1, 1),  # d2 .37 .42 .49 (the 1389-sample runs themselves, not 300-sample pilots)
    "lookahead-tree": (1, 1, 1),  # d2 .53 .60 .62 (likewise)
    "eagle-tree-pruned": (2, 2, 2),  # d2 .75 .74 .74
    "eagle-chain-pruned": (2, 2, 2),  # d3 .35 .29 .29
    "eagle3-tree-pruned": (2, 2, 2),  # d2 .75 .77 .74
    "eagle3-chain-pruned": (2, 2, 2),  # d3 .35 .16 .24
    "eagle-tree-sampled": (3, 3, 3),  # d3 .81 .52 .30
    "eagle3-tree-sampled": (3, 3, 3),  # d3 .82 .63 .52
}
SAMPLED_Q = ("small_model-chain", "eagle-chain", "eagle3-chain")  # chains that report the q they sampled from


def rotated(cases: list[Case], suffix: str = "") -> list:
    """(case, sampling) for every case and config, the configs other than case i's (config i mod 3) marked slow."""
    configs = list(enumerate(zip(SAMPLING_MATRIX, SAMPLING_IDS, strict=True)))
    return [pytest.param(case, sampling, id=f"{case}{suffix}-{name}",
                         marks=() if j == i % len(configs) else pytest.mark.slow)
            for i, case in enumerate(cases) for j, (sampling, name) in configs]


def min_depth(key: str, sampling) -> int:
    return MIN_DEPTH[key][SAMPLING_MATRIX.index(sampling)]


def test_every_case_states_its_depth():
    assert {str(case) for case in CASES} | {f"{case}-pruned" for case in PRUNED_CASES} \
        | {f"{case}-sampled" for case in SAMPLED_TREE_CASES} == set(MIN_DEPTH)


def test_every_registered_drafter_has_a_case_in_each_of_its_modes():
    assert set(sf.list_drafters()) <= {case.name for case in CASES}
    trees = {case.name for case in CASES if case.mode == "tree"}
    assert {"prompt_lookup", "medusa", "eagle", "suffix", "recycling", "rest"} <= trees
    assert {"prompt_lookup", "medusa", "eagle", "suffix", "lookahead"} <= trees


def test_lookup_prompts_repeat_their_base():
    prompts = lookup_prompts()
    assert prompts["chain"][-3:] == PROMPT == prompts["chain"][:3] and len(prompts["chain"]) == 9
    assert prompts["tree"][3] != prompts["tree"][9]  # two branches from depth 1


@pytest.mark.parametrize(("case", "sampling"), rotated(CASES))
def test_lossless_at_full_depth(case, sampling):
    [fit] = assert_lossless(case.factory, configs=[sampling], min_depth=min_depth(str(case), sampling),
                            prompt=case.prompt())
    depth = fit.depth
    assert depth.deepest_verified == depth.deepest_drafted == DEPTH, depth.summary()
    assert (depth.trees > 0) == (case.mode == "tree"), depth.summary()
    print(f"\n{case}: {fit.describe()}")


@pytest.mark.parametrize(("case", "sampling"), rotated(PRUNED_CASES, "-pruned"))
def test_lossless_with_a_reduced_draft_vocabulary(case, sampling):
    """FR-Spec: drafts over 5 of the 8 tokens, verified over all 8; the drafts never leave the subset."""
    drafted: set[int] = set()

    def factory(target):
        drafter = case.factory(target)
        propose = drafter.propose

        def recording(ctx, gamma):
            draft = propose(ctx, gamma)
            drafted.update(draft.tokens.tolist())
            return draft

        drafter.propose = recording
        return drafter

    [fit] = assert_lossless(factory, configs=[sampling], min_depth=min_depth(f"{case}-pruned", sampling),
                            prompt=case.prompt())
    assert fit.depth.deepest_verified == DEPTH, fit.depth.summary()
    assert drafted and drafted <= set(PRUNED)


@pytest.mark.parametrize(("case", "sampling"), rotated(SAMPLED_TREE_CASES, "-sampled"))
def test_lossless_sampled_trees_at_full_depth(case, sampling):
    """EAGLE trees drawn without replacement, each child with its conditional q: lossless, verified 3 deep, with
    power at depth 3 (a q misreported only there would be caught)."""
    [fit] = assert_lossless(case.factory, configs=[sampling], min_depth=min_depth(f"{case}-sampled", sampling),
                            prompt=case.prompt(), require_depth=True)
    depth = fit.depth
    assert depth.deepest_verified == depth.deepest_drafted == DEPTH, depth.summary()
    assert depth.trees > 0, depth.summary()
    print(f"\n{case}-sampled: {fit.describe()}")


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLING_MATRIX, ids=SAMPLING_IDS)
@pytest.mark.parametrize("case", [case for case in CASES if str(case) in SAMPLED_Q], ids=str)
def test_sampled_q_drafters_have_power_at_depth_three(case, sampling):
    """Power 0.9 against a q misreported only at depth 3, at whatever sample count the measured share needs."""
    [fit] = assert_lossless(case.factory, configs=[sampling], min_depth=DEPTH, max_samples=20000,
                            prompt=case.prompt())
    assert fit.depth_power >= 0.9, fit.describe()


@dataclass
class Scripted:
    """A draft-length policy that answers a script, then ``then`` (the protocol's three methods)."""

    script: list[int]
    then: int = DEPTH

    def reset(self) -> None:
        pass

    def next_gamma(self) -> int:
        return self.script.pop(0) if self.script else self.then

    def update(self, proposed, accepted, c=None, tokens=None, verified=None, overhead=None) -> None:
        pass


@pytest.mark.parametrize("case", [case for case in CASES if case.mode == "chain" or case.name in
                                  ("recycling", "merge", "prompt_lookup")], ids=str)
def test_a_request_after_one_that_ended_on_a_draft_keeps_the_greedy_text(case):
    """The loop does not observe a request's last pass. A drafter whose next request opens with passes that draft
    nothing (a policy that learned, or was handed from an earlier drafter, that drafting does not pay) must not act
    on that unobserved draft (small_model rolled its fresh cache back to it and raised)."""
    target = tiny_target("llama", vocab_size=8, spread=1.0, dtype=torch.float32)
    prompt = list(case.prompt())
    drafter = case.factory(target)
    drafter.policy = Scripted([])
    first = sf.generate(target, drafter, prompt, max_new_tokens=6)
    tokens = prompt + first.tokens
    ctx = sf.DecodeContext(target, torch.tensor(prompt), sf.SamplingConfig(temperature=0.0), torch.Generator(), tokens)
    assert len(drafter.propose(ctx, DEPTH)), "no last draft: the case tests nothing"  # the pass that ended it
    drafter.policy = Scripted([0, 0, 0])
    second = sf.generate(target, drafter, prompt[1:], max_new_tokens=12)
    assert second.tokens == sf.generate(target, None, prompt[1:], max_new_tokens=12).tokens
    assert any(len(tokens) for tokens in second.trace.draft_tokens)  # it drafted again after the plain passes
