"""Drafters in batches: one drafter instance per batch slot, and the batched proposal call.

A drafter written for one request keeps per-request state on itself (an n-gram index, a draft model's KV cache, the
last target feature). Batched decoding therefore gives each slot its own copy of the drafter (:func:`slot_copy`):
a deep copy that shares, instead of copying, every ``torch.nn.Module`` with its parameters and buffers (read-only
weights), every lean forward over such a module (its tables are read-only too: a draft model's rope table and
weight views), every tokenizer, the verifying target, and the attributes the drafter names in ``batch_shared`` (e.g.
a cache meant to learn across requests). :func:`propose_batch` asks every slot for its draft through the prototype's
``propose_batch(drafters, ctxs, gammas)``: BaseDrafter's default loops over each slot's ``propose``, so a third-party
batch-1 drafter works unchanged; a family with a model of its own batches its draft forwards (Medusa). After the pass
:func:`observe_batch` hands every slot its outcome the same way (``observe_batch``, BaseDrafter's default looping).

Each slot's :class:`DecodeContext` carries a :class:`SlotTarget`: the target as that slot's request sees it (its
``cached_length`` and a batch-1 view of its cache rows), so a drafter that runs the target's own layers over its
request (self-speculation) reads only its own slot.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import Drafter
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.runtime.batch_cache import BatchCache
from specfamily.runtime.lean import LeanLlama

__all__ = ["SlotCopier", "SlotTarget", "observe_batch", "propose_batch", "slot_copy"]

_WALK_DEPTH = 6


class SlotTarget:
    """The verifying target seen from one slot: ``cached_length`` and ``cache`` are the slot's, the rest the target's.

    ``slot`` follows the request when the loop packs the live slots."""

    def __init__(self, target, cache: BatchCache, slot: int) -> None:
        self._target, self._cache, self.slot = target, cache, slot

    @property
    def cached_length(self) -> int:
        return self._cache.lengths[self.slot]

    @property
    def cache(self):
        """A batch-1 DynamicCache over this slot's committed entries (appends go to new tensors, not the slots)."""
        return self._cache.slot_view(self.slot)

    @property
    def batch_cache(self) -> BatchCache:
        """The whole batch's cache, for a drafter that runs the target's layers over many slots in one call; it may
        write past a slot's committed length but must leave ``lengths`` as it found them."""
        return self._cache

    def __getattr__(self, name: str):
        target = self.__dict__.get("_target")
        if target is None:  # an instance not initialized (unpickling looks up __setstate__): nothing to forward to
            raise AttributeError(name)
        return getattr(target, name)

    def __deepcopy__(self, memo: dict) -> SlotTarget:
        """Itself: a view of the batch's shared target and cache, shared by a copy of a drafter that holds it (a
        drafter's kept context), as the target is."""
        return self

    def __repr__(self) -> str:
        return f"SlotTarget(slot={self.slot}, cached_length={self.cached_length}, {self._target!r})"


def slot_copy(drafter: Drafter, target) -> Drafter:
    """A copy of ``drafter`` for one batch slot: its own per-request state, the modules, the target and the
    attributes named in ``batch_shared`` shared with the original."""
    return SlotCopier(drafter, target).copy()


class SlotCopier:
    """:func:`slot_copy` for many slots of one prototype: what the copies share is found once (walking the
    prototype, the target's model and its lean forward's tensors cost more than the copy itself: docs/batching-log.md,
    session 22), then each copy deep-copies the rest. The prototype must not gain
    modules or ``batch_shared`` attributes while the copier is in use (the batched loop never runs it)."""

    def __init__(self, prototype: Drafter, target) -> None:
        self.prototype = prototype
        self._shared: dict[int, object] = {id(target): target}
        _share_modules(prototype, self._shared, set(), _WALK_DEPTH)

    def copy(self) -> Drafter:
        return copy.deepcopy(self.prototype, dict(self._shared))  # deepcopy adds to the memo it is given


def _share_modules(obj, memo: dict[int, object], seen: set[int], depth: int) -> None:
    """Put into ``memo`` every nn.Module reachable from ``obj`` (with its submodules, parameters, buffers and
    ``__dict__``: :func:`_share_module_state`), every lean forward (a draft model's: copying its rope table and the
    rest cost most of a small_model slot's copy, docs/batching-log.md, session 26), every tokenizer (read-only; copying
    a draft model's costs more than a batched pass) and the attributes each reachable object names in
    ``batch_shared``."""
    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (PreTrainedTokenizerBase, LeanLlama)):
        memo[id(obj)] = obj
        return
    if isinstance(obj, nn.Module):
        for module in obj.modules():
            if id(module) in memo:  # walked as part of a module reached before (self_spec's layers: its model's)
                continue
            memo[id(module)] = module
            seen.add(id(module))
            _share_module_state(module, memo)
        for tensor in (*obj.parameters(), *obj.buffers()):
            memo[id(tensor)] = tensor
        return
    if isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = obj
    else:
        attributes = getattr(obj, "__dict__", {})
        shared = getattr(obj, "batch_shared", ())
        for name in shared:  # a wrapped drafter's shared attributes are shared too
            if name in attributes:
                memo[id(attributes[name])] = attributes[name]
        children = [value for name, value in attributes.items() if name not in shared]  # a shared one is not copied
    for child in children:
        _share_modules(child, memo, seen, depth - 1)


def _share_module_state(module: nn.Module, memo: dict[int, object]) -> None:
    """The module's ``__dict__`` and what it holds (hook tables, its config): the shared module's own, so a drafter
    object that holds them (the lean forward's hook watch, a config) holds the module's, not a copy that never sees
    a hook added to the module (and copying its ~10 dicts a module cost most of a small_model slot's copy)."""
    state = vars(module)
    memo[id(state)] = state
    for value in state.values():
        if not isinstance(value, torch.Tensor):
            memo[id(value)] = value


def propose_batch(prototype: Drafter, drafters: Sequence[Drafter], ctxs: Sequence[DecodeContext],
                  gammas: Sequence[int]) -> list[Draft]:
    """Each slot's draft of ``gammas[i]`` tokens (an empty draft for gamma 0): the prototype's
    ``propose_batch(drafters, ctxs, gammas)`` (BaseDrafter's default loops; families with a model batch it), or, for
    a drafter that does not derive from BaseDrafter and has none, each slot's own ``propose``."""
    own = getattr(prototype, "propose_batch", None)
    if callable(own):
        drafts = own(list(drafters), list(ctxs), list(gammas))
        if len(drafts) != len(drafters):
            raise ValueError(f"propose_batch returned {len(drafts)} drafts for {len(drafters)} slots")
        return drafts
    return [drafter.propose(ctx, gamma) if gamma > 0 else Draft.empty()
            for drafter, ctx, gamma in zip(drafters, ctxs, gammas, strict=True)]


def observe_batch(prototype: Drafter, drafters: Sequence[Drafter], outcomes: Sequence[VerifyOutcome]) -> None:
    """Each slot's drafter observes its outcome of the pass: the prototype's ``observe_batch(drafters, outcomes)``
    (BaseDrafter's default loops), or, for a drafter that does not derive from BaseDrafter and has none, each slot's
    own ``observe``."""
    own = getattr(prototype, "observe_batch", None)
    if callable(own):
        own(list(drafters), list(outcomes))
        return
    for drafter, outcome in zip(drafters, outcomes, strict=True):
        drafter.observe(outcome)
