"""Greedy answers of a batch on the lean forward, with a preallocated KV cache: ``distill``'s ``fast`` engine.

The batch is left-padded as ``generate()`` pads it, so every row sees the same positions, pads and keys as under
``generate()`` (``answer_tokens`` steps at most). Unlike ``generate()``, the cache is allocated once and written in
place; a row that has finished leaves the batch (the last active row's cache moves into its slot); and the lean
forward (``specfamily.runtime.lean``) returns the final-norm hidden state of every fed position from the same pass.

Rows leaving the batch change later products' shapes, and ``stream``/``skinny`` sum in other orders, so a greedy
choice can differ from ``generate()``'s only where two logits tie to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfamily.runtime.lean import LeanLlama

__all__ = ["SlotCache", "fast_answers", "left_pad"]


@dataclass
class SlotCache:
    """Keys and values of every layer for ``rows`` rows that advance in lockstep: a pass of q tokens writes slots
    ``length .. length + q - 1`` of every active row (the duck-typed ``update`` the lean layers call)."""

    keys: torch.Tensor  # (layers, rows, kv heads, slots, head dim)
    values: torch.Tensor
    rows: int  # active rows: the first ``rows`` of the batch dimension
    length: int = 0  # slots written (the same for every row)

    @classmethod
    def empty(cls, model: torch.nn.Module, rows: int, slots: int, dtype: torch.dtype) -> SlotCache:
        config = model.config
        attn = model.model.layers[0].self_attn
        shape = (config.num_hidden_layers, rows, config.num_key_value_heads, slots, attn.head_dim)
        device = model.lm_head.weight.device
        return cls(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device), rows)

    def get_seq_length(self) -> int:
        return self.length

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the pass's keys and values (rows, kv heads, q, D) after the cached ones; return all of them."""
        end = self.length + key.shape[2]
        if end > self.keys.shape[3]:
            raise ValueError(f"the cache holds {self.keys.shape[3]} positions; a pass would fill {end}")
        self.keys[layer, : self.rows, :, self.length : end] = key
        self.values[layer, : self.rows, :, self.length : end] = value
        return self.keys[layer, : self.rows, :, :end], self.values[layer, : self.rows, :, :end]


@dataclass
class Rows:
    """The rows still answering, in cache order: which prompt each is, its left padding and its next token."""

    prompt: list[int]  # prompt index of each active row
    pad: torch.Tensor  # (rows,) long, left padding of each active row
    next: torch.Tensor  # (rows,) long, the token each row emitted last (fed next)
    answers: list[list[int]] = field(default_factory=list)  # by prompt index
    features: list[list[torch.Tensor]] = field(default_factory=list)  # by prompt index, (n, H) pieces

    def drop(self, finished: list[int], cache: SlotCache) -> None:
        """Remove the active rows ``finished`` (indices in cache order): the last active row fills each gap."""
        for slot in sorted(finished, reverse=True):
            last = cache.rows - 1
            if slot != last:
                cache.keys[:, slot, :, : cache.length] = cache.keys[:, last, :, : cache.length]
                cache.values[:, slot, :, : cache.length] = cache.values[:, last, :, : cache.length]
                self.prompt[slot] = self.prompt[last]
                self.pad[slot] = self.pad[last]
                self.next[slot] = self.next[last]
            self.prompt.pop()
            cache.rows -= 1
        self.pad = self.pad[: cache.rows]
        self.next = self.next[: cache.rows]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, width) with each prompt at the right end, padding (B,) long): ``generate()``'s left padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
    return ids, torch.tensor([width - len(p) for p in prompts], dtype=torch.long)


def prefill_mask(pad: torch.Tensor, width: int) -> torch.Tensor:
    """(B, 1, width, width) boolean: causal over each row's own tokens; a pad query sees only itself (its output is
    never read and no real query sees a pad key, so what it attends to changes nothing but avoids an empty row)."""
    slots = torch.arange(width, device=pad.device)
    causal = slots[None, :] <= slots[:, None]
    real_key = slots[None, None, :] >= pad[:, None, None]
    return ((causal[None] & real_key) | torch.eye(width, dtype=torch.bool, device=pad.device)[None]).unsqueeze(1)


@torch.inference_mode()
def fast_answers(
    lean: LeanLlama, prompts: list[list[int]], eos: int, answer_tokens: int
) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy answers: (prompt + answer tokens, final-norm features of every token but the last) per prompt.

    An answer ends with ``eos`` (kept) or after ``answer_tokens`` tokens, as ``generate()``'s greedy search ends it.
    """
    if answer_tokens < 1:
        raise ValueError(f"answer_tokens must be at least 1, got {answer_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if not lean.ready():
        raise ValueError("the lean forward cannot run this target now (hooks, training mode or another attention)")
    model = lean.model
    device = model.lm_head.weight.device
    ids, pad = (t.to(device) for t in left_pad(prompts, eos))
    width = ids.shape[1]
    cache = SlotCache.empty(model, len(prompts), width + answer_tokens, model.lm_head.weight.dtype)
    positions = (torch.arange(width, device=device)[None, :] - pad[:, None]).clamp(min=0)
    logits, hidden = lean(ids, positions, prefill_mask(pad, width), cache, keep=1, features=True)
    cache.length = width
    rows = Rows(list(range(len(prompts))), pad.clone(), logits[:, -1].argmax(-1),
                [[] for _ in prompts], [[hidden[r, int(pad[r]):]] for r in range(len(prompts))])
    while True:
        finished = []
        for slot, (index, token) in enumerate(zip(rows.prompt, rows.next.tolist(), strict=True)):
            rows.answers[index].append(token)
            if token == eos or len(rows.answers[index]) == answer_tokens:
                finished.append(slot)
        rows.drop(finished, cache)
        if cache.rows == 0:
            break
        fed = rows.next.view(-1, 1)
        position = (cache.length - rows.pad).view(-1, 1)
        width = cache.length + 1  # a fed token sees every cached slot of its row but the left padding
        mask = (torch.arange(width, device=rows.pad.device)[None, :] >= rows.pad[:, None]).view(-1, 1, 1, width)
        logits, hidden = lean(fed, position, mask, cache, keep=1, features=True)
        cache.length += 1
        for slot, index in enumerate(rows.prompt):
            rows.features[index].append(hidden[slot])
        rows.next = logits[:, -1].argmax(-1)
    return [(prompt + answer, torch.cat(pieces).cpu()) for prompt, answer, pieces in
            zip(prompts, rows.answers, rows.features, strict=True)]
