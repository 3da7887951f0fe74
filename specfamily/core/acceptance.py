"""The acceptance rule the decode loop calls, chosen once per request.

``verify_draft`` is the exact rule: greedy matching at temperature 0, else recursive rejection sampling against the
warped p (:mod:`specfamily.core.verify`). A lossy drafter (``lossy=True``) may bring its own rule with the same
signature (``Drafter.accept``; Medusa's typical acceptance, :mod:`specfamily.core.typical`). Either is fed the
target's logits after the processors its generation config sets, each row with its own context
(:mod:`specfamily.core.processors`); with none set the rule is returned unwrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specfamily.core import host
from specfamily.core.context import DecodeContext
from specfamily.core.drafter import AcceptRule, Hooks
from specfamily.core.processors import processors_for
from specfamily.core.sampling import greedy_tokens, native_available, warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import (
    DraftProbabilityError,
    check_shapes,
    device_walk,
    greedy_tree,
    greedy_walk,
    verify_tree,
    verify_tree_rows,
    walk_verdict,
)


def verify_draft(
    draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
) -> tuple[list[int], int]:
    """Warp the target's logits (n+1, V) into p and accept a path of ``draft``: (accepted nodes, next token).

    On the CPU only the rows the walk reads are warped, when first reached (:func:`lazy_rows`; the same rows, bit for
    bit, as warping all of them); on an accelerator all rows are warped there in one call and cross to the host
    once."""
    if sampling.greedy:
        return greedy_tree(draft.tokens, draft.parents, greedy_tokens(logits))
    if logits.device.type == "cpu" and (generator is None or generator.device.type == "cpu"):
        p_row = lazy_rows(logits, sampling, draft.parents.tolist() == list(range(-1, draft.tokens.numel() - 1)))
        return verify_tree_rows(draft.tokens, draft.parents, draft.q, p_row, tuple(logits.shape), generator)
    return verify_tree(draft.tokens, draft.parents, draft.q, warp(logits, sampling), generator)


def verify_greedy_slots(drafts: Sequence[Draft], logits: Sequence[torch.Tensor]) -> list[tuple[list[int], int]]:
    """:func:`verify_draft` at temperature 0 for every request of a batched pass at once: each slot's argmax rows
    (``logits[i]`` (n_i + 1, V) for ``drafts[i]``) and every draft's tokens reach the host in one copy, where slot
    by slot each request's verdict waited for its own (on an accelerator, one synchronisation a pass, not one a
    request, and one argmax over every slot's rows, not one kernel a request). The same verdicts, slot for slot, as
    ``verify_draft`` gives."""
    n = len(drafts)
    if logits[0].device.type == "cpu":  # the C++ argmax over each slot's rows where they are (no joined copy)
        best = [greedy_tokens(rows) for rows in logits]
    else:
        best = list(greedy_tokens(torch.cat(list(logits))).split([rows.shape[0] for rows in logits]))
    moved = host.to_host([*best, *(d.tokens for d in drafts), *(d.parents for d in drafts)])
    return [greedy_walk(tokens.tolist(), parents.tolist(), best.tolist())
            for best, tokens, parents in zip(moved[:n], moved[n : 2 * n], moved[2 * n :], strict=True)]


def walks_on_device(logits: torch.Tensor, generator: torch.Generator | None) -> bool:
    """Whether :func:`verify_draft` under sampling walks on the logits' device (its uniforms come from an
    accelerator) rather than on the host."""
    return host.draw_device(logits, generator).type != "cpu"


def verify_sampled_slots(drafts: Sequence[Draft], logits: Sequence[torch.Tensor], sampling: SamplingConfig,
                         generators: Sequence[torch.Generator], names: Sequence[str]) -> list[tuple[list[int], int]]:
    """:func:`verify_draft` under sampling for every request of a batched pass whose walks run on the device
    (:func:`walks_on_device`): each request's p warped and its walk queued there with its own generator's uniforms,
    every result reaching the host in one copy, where slot by slot each waited for its own. The same verdicts and
    generator states as ``verify_draft`` slot by slot; a q it refuses is named with ``names[i]``, its drafter."""
    walks = []
    for draft, rows, generator in zip(drafts, logits, generators, strict=True):
        n, p = draft.tokens.numel(), warp(rows, sampling)
        check_shapes(n, tuple(p.shape), draft.q)
        walks.append(device_walk(draft.tokens, draft.parents, draft.q, p,
                                 host.uniform_block(n + 1, generator, host.draw_device(p, generator))))
    verdicts = []
    for draft, values, name in zip(drafts, host.to_host(walks), names, strict=True):
        try:
            verdicts.append(walk_verdict(values.tolist(), draft.tokens, draft.q))
        except DraftProbabilityError as err:
            raise DraftProbabilityError(f"{name}: {err}") from err
    return verdicts


def lazy_rows(logits: torch.Tensor, sampling: SamplingConfig, chain: bool) -> Callable[[int], torch.Tensor]:
    """Row i of warp(logits) (n + 1, V) -> (V,), warped when first asked for, alone: the rows past a rejection are
    never warped. Off the C++ warp (:func:`specfamily.core.sampling.native_warp`: not built, or rows off the CPU), a
    ``chain``'s rows past the root go from i to its end in one call (a chain whose first draft is accepted reads on
    down it, and one torch call over several rows costs less than a torch call per row); a tree's row alone."""
    rows: dict[int, torch.Tensor] = {}
    together = chain and not (logits.device.type == "cpu" and native_available())  # the C++ warp takes CPU rows only

    def p_row(i: int) -> torch.Tensor:
        if i not in rows:
            block = warp(logits[i:] if together and i > 0 else logits[i : i + 1], sampling)
            rows.update((i + j, row) for j, row in enumerate(block))
        return rows[i]

    return p_row


def acceptance(hooks: Hooks | None, ctx: DecodeContext) -> AcceptRule:
    """The rule for this request: the exact verifier, or a lossy drafter's own ``accept`` (same signature), fed the
    logits after the processors the target's generation config sets. ``hooks`` None: plain decoding."""
    own = hooks.accept if hooks is not None else None
    return with_processors(own if own is not None else verify_draft, ctx)


def with_processors(rule: Callable, ctx: DecodeContext) -> Callable:
    """The acceptance ``rule`` (verify_draft's signature) fed the target's logits after the processors its
    generation config sets, each row with its own context from ``ctx.tokens``; ``rule`` itself when none is set."""
    target = ctx.target
    processors = processors_for(getattr(target.model, "generation_config", None), target.eos_token_ids,
                                target.vocab_size)
    if processors is None:
        return rule
    state = processors.start(ctx.tokens, target.vocab_size, target.device)

    def accept(draft: Draft, logits: torch.Tensor, sampling, generator) -> tuple[list[int], int]:
        return rule(draft, state.apply(ctx.tokens, draft.tokens, draft.parents, logits), sampling, generator)

    return accept
