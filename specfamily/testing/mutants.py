"""A verifier gallery: subtly wrong verifiers (and one wrong warp) to patch into the decode loop.

Each mutant is a realistic bug in ``specfamily.core.verify`` or ``core.acceptance.verify_draft``, with the honest
drafter and sampling config under which it bites; a conformance test that passes with a mutant installed has no
power against that bug. Use::

    for mutant in verifier_gallery():
        with mutant.installed() as hits:
            ...  # run your test: it must fail
        assert hits.count  # and the wrong branch must have run

``installed()`` replaces one module attribute for the block (``everywhere``: also where it was imported by name)
and counts in ``hits`` each time the bug changed what the verifier did.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module

import torch

from specfamily.core import sampling as core_sampling
from specfamily.core import side_rows as core_side_rows
from specfamily.core import verify as core_verify
from specfamily.core.types import Draft, SamplingConfig
from specfamily.testing.rogues import HonestChain, HonestSideRows, HonestTree


@dataclass
class Hits:
    """How often a mutant's wrong branch ran (and changed what the honest code would have done)."""

    count: int = 0


@dataclass(frozen=True)
class Mutant:
    """A gallery entry: the bug, where it goes (``module:attribute``), how to build it, and how to exercise it."""

    name: str
    bug: str
    where: str  # "module:attribute" the wrong function replaces
    make: Callable[[Hits], Callable]  # hits -> the wrong function
    drafter: type  # an honest drafter of the rogues' gallery that reaches the wrong branch
    noise: float  # its tilt away from the target: small for short runs, large enough for the branch to matter
    sampling: SamplingConfig  # a config under which the bug changes the law
    everywhere: bool = False  # also replace it in every loaded specfamily module that imported it by name

    def factory(self, target):
        """The honest drafter to run with the mutant installed (``factory(target) -> Drafter``)."""
        return self.drafter(target, noise=self.noise)

    @contextmanager
    def installed(self) -> Iterator[Hits]:
        """Install the mutant for the block; yields the hit counter."""
        module_name, attribute = self.where.split(":")
        original = getattr(import_module(module_name), attribute)
        hits = Hits()
        wrong = self.make(hits)
        homes = _homes(original, module_name, attribute, self.everywhere)
        for module in homes:
            setattr(module, attribute, wrong)
        try:
            yield hits
        finally:
            for module in homes + _homes(wrong, module_name, attribute, self.everywhere):  # late imports too
                setattr(module, attribute, original)


def _homes(function: Callable, module_name: str, attribute: str, everywhere: bool) -> list:
    """The modules whose ``attribute`` is ``function``: its own module, and with ``everywhere`` every specfamily one."""
    if not everywhere:
        return [sys.modules[module_name]]
    ours = [module for name, module in list(sys.modules.items()) if name.split(".")[0] == "specfamily"]
    return [module for module in ours if getattr(module, attribute, None) is function]


# --- the wrong walks (replacements for specfamily.core.verify._walk) -------------------------------------------

def _row(q64: torch.Tensor | None, child: int) -> torch.Tensor | None:
    return None if q64 is None else q64[child]


def _try_children(children: list[int], tokens: list[int], q64, residual: torch.Tensor, draws):
    """The honest sibling loop: (accepted child or None, number of rejections, the residual left)."""
    rejections = 0
    for child in children:
        ok, rejected = core_verify._try_child(residual, tokens[child], _row(q64, child), draws)
        if ok:
            return child, rejections, residual
        rejections += 1
        residual = core_verify._normalise(rejected, residual)
    return None, rejections, residual


def _resample_from_p(hits: Hits) -> Callable:
    """After a rejection, the next token is drawn from the node's original p, not from the running residual."""
    def walk(children, tokens, q64, p64, draws):
        path, node, residual = [], -1, p64[0]
        while True:
            accepted, rejections, residual = _try_children(children.get(node, []), tokens, q64, residual, draws)
            if accepted is None:
                hits.count += rejections > 0
                return path, draws.sample(p64[node + 1] if rejections else residual)
            path.append(accepted)
            node, residual = accepted, p64[accepted + 1]
    return walk


def _row_off_by_one(hits: Hits) -> Callable:
    """On acceptance the walk descends to row ``child`` of p (the row before the child's own, ``child + 1``)."""
    def walk(children, tokens, q64, p64, draws):
        path, node, residual = [], -1, p64[0]
        while True:
            accepted, _, residual = _try_children(children.get(node, []), tokens, q64, residual, draws)
            if accepted is None:
                return path, draws.sample(residual)
            path.append(accepted)
            hits.count += 1
            node, residual = accepted, p64[accepted]
    return walk


def _bonus_from_last_residual(hits: Hits) -> Callable:
    """When the whole path to a leaf is accepted, the bonus token is drawn from the distribution the leaf was
    accepted against (its parent's) instead of the leaf's own row of p."""
    def walk(children, tokens, q64, p64, draws):
        path, node, residual = [], -1, p64[0]
        last = residual
        while True:
            accepted, _, residual = _try_children(children.get(node, []), tokens, q64, residual, draws)
            if accepted is None:
                bonus = bool(path) and node not in children
                hits.count += bonus
                return path, draws.sample(last if bonus else residual)
            path.append(accepted)
            last = residual
            node, residual = accepted, p64[accepted + 1]
    return walk


def _readmit_rejected_sibling(hits: Hits) -> Callable:
    """Each sibling is tried against the node's distribution before any sibling was rejected, and the final draw
    excludes only the last rejected one: earlier rejected siblings come back."""
    def walk(children, tokens, q64, p64, draws):
        path, node, residual = [], -1, p64[0]
        while True:
            before, accepted = residual, None
            for tried, child in enumerate(children.get(node, [])):
                hits.count += tried > 0
                ok, rejected = core_verify._try_child(before, tokens[child], _row(q64, child), draws)
                if ok:
                    accepted = child
                    break
                residual = core_verify._normalise(rejected, before)
            if accepted is None:
                return path, draws.sample(residual)
            path.append(accepted)
            node, residual = accepted, p64[accepted + 1]
    return walk


# --- wrong p: replacements for specfamily.core.acceptance.verify_draft and for the warp ------------------------------

def _unwarped_p(hits: Hits) -> Callable:
    """Accepts against softmax(logits), the target's raw distribution, instead of warp(logits, sampling)."""
    def verify_draft(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator):
        if sampling.greedy:
            return core_verify.greedy_tree(draft.tokens, draft.parents, logits.argmax(dim=-1))
        raw = torch.softmax(logits.float(), dim=-1)
        hits.count += not torch.allclose(raw, core_sampling.warp(logits, sampling))
        return core_verify.verify_tree(draft.tokens, draft.parents, draft.q, raw, generator)
    return verify_draft


def _top_p_before_temperature(hits: Hits) -> Callable:
    """A warp that cuts top-p on the untempered distribution and applies the temperature after it."""
    honest = core_sampling.warp

    def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        if sampling.greedy:
            return core_sampling.greedy_probs(logits)
        untempered = torch.softmax(core_sampling.top_k_filter(logits.float(), sampling.top_k), dim=-1)
        keep = core_sampling.top_p_filter(untempered, sampling.top_p) > 0
        scaled = (logits.float() / sampling.temperature).masked_fill(~keep, float("-inf"))
        probs = torch.softmax(core_sampling.top_k_filter(scaled, sampling.top_k), dim=-1)
        hits.count += not torch.equal(probs > 0, honest(logits, sampling) > 0)
        return probs
    return warp


def verifier_gallery() -> list[Mutant]:
    """Wrong verifiers, each with the honest drafter and the config under which the conformance kit must catch it.

    The tilts are the smallest that leave the kit's verdict far from its significance level (so that its sample
    count, sized by how often drafts reach depth 3, stays low): re-admitting a sibling only matters after a
    rejection, so the tree it runs on is tilted further."""
    chain, tree = SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=5)
    walk = "specfamily.core.verify:_walk"
    return [
        Mutant("resample_from_p", "after a rejection, sample from p instead of the running residual", walk,
               _resample_from_p, HonestChain, 0.1, chain),
        Mutant("row_off_by_one", "tree children read the p row one before their own", walk, _row_off_by_one,
               HonestTree, 0.25, tree),
        Mutant("unwarped_p", "accept against softmax(logits) instead of warp(logits, sampling)",
               "specfamily.core.acceptance:verify_draft", _unwarped_p, HonestChain, 0.1, chain),
        Mutant("bonus_from_last_residual", "after a fully accepted path, the bonus token is drawn from the last "
               "node's distribution instead of the bonus row", walk, _bonus_from_last_residual, HonestChain, 0.1,
               chain),
        Mutant("readmit_rejected_sibling", "siblings after a rejection are tried against the un-residualised p",
               walk, _readmit_rejected_sibling, HonestTree, 0.25, tree),
    ]


def warp_gallery() -> list[Mutant]:
    """Wrong warps, installed in every module that uses the warp (the loop and the drafters alike): the loop stays
    self-consistent, so only a law computed independently of the warp can catch them."""
    return [
        Mutant("top_p_before_temperature", "top-p cut before the temperature is applied",
               "specfamily.core.sampling:warp", _top_p_before_temperature, HonestChain, 0.1,
               SamplingConfig(0.5, top_p=0.8), everywhere=True),
    ]


# --- a leaky side-row mask: a replacement for specfamily.core.side_rows.side_visibility ----------------------------

def _side_rows_visible(hits: Hits) -> Callable:
    """Every verification row (the pending tokens and the draft nodes) sees every side row, as if the side rows were
    part of the committed context."""
    honest = core_side_rows.side_visibility

    def side_visibility(m, parents, side):
        visible = honest(m, parents, side).clone()
        visible[: visible.shape[0] - len(side), visible.shape[0] - len(side) :] = True
        hits.count += 1
        return visible
    return side_visibility


def side_rows_gallery() -> list[Mutant]:
    """A mask that lets verification rows see a draft's side rows: p is then conditioned on the drafter's guesses, so
    the text leaves the target's law (and its greedy text). Installed in ``specfamily.core.side_rows``, which
    ``Target`` reads its side-row layouts through (use a fresh target: layouts are cached per target)."""
    return [
        Mutant("side_rows_visible", "verification rows see the draft's side rows",
               "specfamily.core.side_rows:side_visibility", _side_rows_visible, HonestSideRows, 0.1,
               SamplingConfig(1.0)),
    ]
