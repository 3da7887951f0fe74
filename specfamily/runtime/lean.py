"""A lean forward of Llama-architecture causal LMs (Llama, Mistral, Qwen2): the model's own ops, no module calls.

On a small model a decode step is dominated by per-call work rather than arithmetic: the module tree costs a Python
call per module, and the mask and rotary helpers run per call. ``LeanLlama`` runs the model's own tensor operations,
in its order, on its own weights, and calls sdpa down the same branch transformers' sdpa integration takes for the
call's shape (grouped-query attention: ``enable_gqa``, the single-query packing, or repeated keys and values), so its
logits are bit-identical to the model's forward (tests compare them with ``torch.equal``, in float32 and bfloat16).
What it does not cover exactly is left to the model's forward (``lean_unsupported`` says why). Built with
``linear=skinny_linear`` (``specfamily.runtime.matmul``) it multiplies by its weights in another float32 order, faster
on some CPUs; its logits then differ from the model's in the last bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers.activations import SiLUActivation
from transformers.integrations.sdpa_attention import pack_gqa, repeat_kv, use_gqa_in_sdpa

from specfamily.runtime.attention import MAX_ROWS, kernel_visible
from specfamily.runtime.compiled import Compiled
from specfamily.runtime.lean_support import blocking, global_hooks, lean_unsupported
from specfamily.runtime.matmul import Linear as LinearFn
from specfamily.runtime.matmul import stream_norm
from specfamily.runtime.rope_table import RopeTable

__all__ = ["Attend", "LeanLayer", "LeanLlama", "ModuleWatch", "drafting_ready", "plan_attention", "rms_norm",
           "rope", "rotate_pair"]

Linear = tuple[torch.Tensor, "torch.Tensor | None"]  # weight, bias


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``rotate_half`` without its negation, which the rope's signed sin carries instead: (-a) * s == a * (-s).
    (A roll by half the width: one op where slicing and concatenating took three, the same values.)"""
    return x.roll(x.shape[-1] // 2, -1)


def rotate_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rope applied to a layer's queries and keys (B, heads, q, D), ``sin`` signed (see ``_signed``)."""
    return (query * cos) + (_swap_halves(query) * sin), (key * cos) + (_swap_halves(key) * sin)


@dataclass(frozen=True)
class Attend:
    """How every layer of one pass calls sdpa: the branch transformers' sdpa integration takes for this call."""

    mask: torch.Tensor | None  # additive or boolean, as given (folded onto the key/value heads when ``pack``)
    causal: bool  # sdpa's is_causal: several queries and no mask
    gqa: bool  # sdpa's enable_gqa: grouped heads, no mask
    pack: bool  # grouped heads, a mask, one query (or several, ``pack_queries``): query heads folded onto key heads
    groups: int  # query heads per key/value head; keys and values are repeated when none of the above applies
    rotate: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rotate_pair  # or its compiled version
    kernel: Callable[..., torch.Tensor] | None = None  # the batch-invariant attention (runtime.attention), or sdpa
    visible: torch.Tensor | None = None  # (q, keys) bool: the keys each fed row sees (None: all), for ``kernel``


def plan_attention(
    mask: torch.Tensor | None, q_len: int, groups: int, probe: torch.Tensor, masked_gqa: bool = False,
    pack_queries: bool = False, kernel: Callable[..., torch.Tensor] | None = None,
    visible: torch.Tensor | None = None,
) -> Attend:
    """The sdpa branch for a pass of ``q_len`` queries (``probe``: a tensor shaped like one key row).

    ``masked_gqa`` (the lean forwards under a non-exact matmul kind, which run on the CPU): a masked pass of several
    queries over grouped heads lets sdpa index the key heads (``enable_gqa``) instead of taking transformers' branch,
    which copies every layer's keys and values ``groups`` times (``repeat_kv``); what that copy cost is measured in
    docs/bandwidth-smollm2.md. With ``pack_queries`` too (the target's lean forward, batch 1), such a pass folds the
    ``groups`` query heads of each key head into its rows instead, as the single-query branch does (the mask's rows
    repeated once per group, here, once per pass): sdpa then runs ``groups * q_len`` rows against each key head,
    cheaper on the CPU than its grouped indexing (docs/pass-cost.md) and bit-identical to it where tested.

    ``kernel`` (``specfamily.runtime.attention``'s ``attend``): every pass it takes (``kernel_visible``: one row, or
    a 0 / hidden mask over at most 64 rows) attends with it instead of sdpa, batch-invariant; others take sdpa's
    branch. ``visible``: the caller's (q, keys) bool of where ``mask`` is 0 (a target's tree layout,
    ``TreeLayout.visible``), taken as ``kernel_visible``'s without reading the mask back (a dozen tensor ops a pass)."""
    if kernel is not None:
        if visible is not None and mask is not None and q_len <= MAX_ROWS:
            taken = visible.shape == (q_len, mask.shape[-1])
        else:
            taken, visible = kernel_visible(mask, q_len)
        if taken:
            return Attend(mask, False, gqa=False, pack=False, groups=groups, kernel=kernel, visible=visible)
    causal = q_len > 1 and mask is None
    if groups == 1:
        return Attend(mask, causal, gqa=False, pack=False, groups=1)
    if masked_gqa and pack_queries and q_len > 1 and mask is not None and mask.shape[:2] == (1, 1):
        return Attend(mask.repeat(1, 1, groups, 1), False, gqa=False, pack=True, groups=groups)  # (1, 1, g * q, S)
    if use_gqa_in_sdpa(mask, probe, probe) or (masked_gqa and q_len > 1):
        return Attend(mask, causal, gqa=True, pack=False, groups=groups)
    if q_len == 1:
        return Attend(pack_gqa(mask, groups), False, gqa=False, pack=True, groups=groups)
    return Attend(mask, causal, gqa=False, pack=False, groups=groups)


NormFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The families' RMSNorm forward, op for op (its ``.to`` calls are no-ops on float32 and skipped there)."""
    dtype = hidden.dtype
    if dtype != torch.float32:
        hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * (hidden if dtype == torch.float32 else hidden.to(dtype))


def _signed(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated, so that ``_swap_halves(x) * _signed(sin)`` is ``rotate_half(x) * sin``."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _activation(act: nn.Module):
    """The MLP's activation as a function: ``F.silu`` for transformers' SiLU module, else the module itself."""
    return F.silu if type(act) is SiLUActivation else act


def rope(rotary: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary module's forward on its own inv_freq and attention_scaling, unsqueezed for the heads:
    cos, signed sin (B, 1, q, D) (see ``_signed``)."""
    freqs = position_ids[..., None].float() * rotary.inv_freq.to(device=hidden.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * rotary.attention_scaling
    sin = emb.sin() * rotary.attention_scaling
    return cos.to(dtype=hidden.dtype).unsqueeze(1), _signed(sin.to(dtype=hidden.dtype).unsqueeze(1))


@dataclass
class ModuleWatch:
    """The hook tables and ``__dict__`` of some modules: hooks or replaced forwards added after building show.

    A clean verdict on the hook tables is kept while torch hands out no new hook handle (``RemovableHandle.next_id``:
    every ``register_forward_hook`` / ``register_forward_pre_hook``, global ones included, takes one), so a pass
    after the first reads one counter instead of every module's hooks; a removed hook can only make the tables
    cleaner, and a verdict of hooked is never kept. The ``__dict__`` check (a replaced forward, an accelerate hook)
    and the global hook tables are read on every call.
    """

    hooks: tuple[dict, ...]
    dicts: tuple[dict, ...]
    _clean_at: int = field(default=-1, repr=False, compare=False)  # next_id when the hook tables were last clean

    @classmethod
    def of(cls, modules) -> ModuleWatch:
        modules = tuple(modules)
        return cls(tuple(d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks)),
                   tuple(m.__dict__ for m in modules))

    def clean(self) -> bool:
        """No global hooks, no blocking hook on a watched module, no replaced forward or accelerate hook."""
        return not (global_hooks() or self._replaced() or self._hooked())

    def _replaced(self) -> bool:
        """A watched module's ``__dict__`` holds a forward of its own or an accelerate hook (C-level lookups)."""
        dicts = self.dicts
        return any(map(dict.__contains__, dicts, repeat("forward"))) or any(
            map(dict.__contains__, dicts, repeat("_hf_hook")))

    def _hooked(self) -> bool:
        """A blocking hook on a watched module; read again only after torch has handed out a new hook handle."""
        stamp = RemovableHandle.next_id
        if stamp == self._clean_at:
            return False
        hooked = any(map(len, self.hooks)) and any(blocking(hooks) for hooks in self.hooks)
        if not hooked:
            self._clean_at = stamp
        return hooked


def drafting_ready(model: nn.Module, attn_config, watch: ModuleWatch) -> bool:
    """A drafter's lean layer reproduces its module path right now: no gradients, eval mode, sdpa, no hooks added."""
    return not (
        torch.is_grad_enabled() or model.training or attn_config._attn_implementation != "sdpa"
    ) and watch.clean()


@dataclass(frozen=True)
class LeanLayer:
    """One decoder layer's parameters, gathered once (Parameters keep their identity under .to() and loading);
    calling it runs the layer's forward (batch B, cache optional) with transformers' sdpa attention, op for op."""

    index: int
    norm1: tuple[torch.Tensor, float]  # weight, eps
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    norm2: tuple[torch.Tensor, float]
    gate: Linear
    up: Linear
    down: Linear
    act: object  # callable on a tensor
    head_dim: int
    scaling: float
    linear: LinearFn = F.linear  # (x, weight, bias) -> x @ weight^T + bias: F.linear or skinny_linear
    norm: NormFn = rms_norm  # (x, weight, eps): the families' RMSNorm, or the stream kernel's one-call version

    @classmethod
    def of(cls, layer: nn.Module, linear: LinearFn = F.linear) -> LeanLayer:
        attn, mlp = layer.self_attn, layer.mlp
        lin = lambda m: (m.weight, m.bias)  # noqa: E731
        norm = lambda m: (m.weight, m.variance_epsilon)  # noqa: E731
        return cls(
            attn.layer_idx, norm(layer.input_layernorm), lin(attn.q_proj), lin(attn.k_proj), lin(attn.v_proj),
            lin(attn.o_proj), norm(layer.post_attention_layernorm), lin(mlp.gate_proj), lin(mlp.up_proj),
            lin(mlp.down_proj), _activation(mlp.act_fn), attn.head_dim, attn.scaling, linear,
            stream_norm(linear) or rms_norm,
        )

    def __call__(self, hidden, cos, sin, attend: Attend, cache) -> torch.Tensor:
        """The decoder layer's forward on hidden (B, q, H); ``cache``: a transformers Cache or None."""
        return self.mlp_block(self.attention_block(hidden, cos, sin, attend, cache))

    def attention_block(self, hidden, cos, sin, attend: Attend, cache) -> torch.Tensor:
        """hidden + attention(norm(hidden)): the layer's first residual sub-layer."""
        return hidden + self._attention(self.norm(hidden, *self.norm1), cos, sin, attend, cache)

    def mlp_block(self, hidden) -> torch.Tensor:
        """hidden + mlp(norm(hidden)): the layer's second residual sub-layer."""
        x = self.norm(hidden, *self.norm2)
        linear = self.linear
        return hidden + linear(self.act(linear(x, *self.gate)) * linear(x, *self.up), *self.down)

    def _attention(self, x, cos, sin, attend: Attend, cache) -> torch.Tensor:
        batch, q_len = x.shape[:2]
        shape = (batch, q_len, -1, self.head_dim)
        query = self.linear(x, *self.q).view(shape).transpose(1, 2)  # (B, heads, q, D)
        key = self.linear(x, *self.k).view(shape).transpose(1, 2)  # (B, kv heads, q, D)
        value = self.linear(x, *self.v).view(shape).transpose(1, 2)
        query, key = attend.rotate(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.index)
        if attend.kernel is not None:  # (B, q, heads * D), batch-invariant (runtime.attention)
            return self.linear(attend.kernel(query, key, value, attend.visible, self.scaling), *self.o)
        if attend.causal and key.shape[2] > q_len:  # transformers' sdpa keeps the first q keys of a causal pass
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        if attend.pack:  # (B, kv heads, groups * q, D): each key head's query heads as rows
            query = pack_gqa(query, attend.groups) if q_len == 1 else query.reshape(batch, -1, attend.groups * q_len,
                                                                                      self.head_dim)
        elif attend.groups > 1 and not attend.gqa:
            key, value = repeat_kv(key, attend.groups), repeat_kv(value, attend.groups)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attend.mask, dropout_p=0.0,
                                             scale=self.scaling, is_causal=attend.causal, enable_gqa=attend.gqa)
        out = out.reshape(out.shape[0], -1, q_len, value.shape[-1]).transpose(1, 2).contiguous()
        return self.linear(out.reshape(batch, q_len, -1).contiguous(), *self.o)


class LeanLlama:
    """A Llama/Mistral/Qwen2 causal LM forward without module calls; build it only when ``lean_unsupported`` is None.

    It gathers the model's parameters when built (later in-place weight updates are seen; replacing modules
    needs a new LeanLlama), and declines (``ready`` is False) while any module has hooks, the model is training or
    its attention implementation is no longer sdpa; the caller then uses the model's forward.
    """

    def __init__(self, model: nn.Module, linear: LinearFn = F.linear, compile: bool = False) -> None:
        """``compile``: run each layer's rope through ``torch.compile`` (``specfamily.runtime.compiled``: float32
        only, eager wherever compiling fails); off by default, as it measured slower (docs/pass-cost.md)."""
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean forward cannot run this model: {reason}")
        self.model = model
        base = model.model
        self._config, self._embed, self._rotary = base.config, base.embed_tokens, base.rotary_emb
        self._layers = tuple(LeanLayer.of(layer, linear) for layer in base.layers)
        self._linear = linear
        self._norm = (base.norm.weight, base.norm.variance_epsilon)
        self._norm_fn = stream_norm(linear) or rms_norm
        self._head = (model.lm_head.weight, model.lm_head.bias)
        attn = base.layers[0].self_attn
        self._groups: int = attn.num_key_value_groups
        self._probe = torch.empty(0, attn.head_dim)  # a key row's shape, for transformers' GQA predicate
        self._watch = ModuleWatch.of(model.modules())
        self.rotate: Compiled | None = Compiled(rotate_pair) if compile else None
        self.pack_queries = True  # plan_attention's packing of masked verify passes (False: sdpa's grouped indexing)
        self.native = None  # the layers in C++ (specfamily.runtime.native_layers.NativeLayers), set by the caller
        self._rope = RopeTable(rope)  # the rope's cos and sin by position, computed once (bit-identical)
        self.attention = None  # the batch-invariant attention (specfamily.runtime.attention's attend), set by caller

    def ready(self) -> bool:
        """True when the lean forward reproduces the model's forward right now."""
        return not (
            self.model.training
            or self._config._attn_implementation != "sdpa"
            or not self._watch.clean()
        )

    def __call__(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, cache, keep: int,
        features: bool | tuple[int, ...] = False, visible: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (1, keep, V) of the last ``keep`` positions, last hidden state after the norm (1, q, H) or None).

        ``mask``: a 4D mask over the cached and fed positions, or None for one token (it sees the whole cache) or
        a causal pass over an empty cache. ``features`` a tuple of layer ids: the hidden states of those layers
        (transformers' ``hidden_states`` indexing: i < L the input of layer i, L after the final norm)
        concatenated, (1, q, k * H). ``visible``: where ``mask`` is 0, (q, keys) bool, if the caller has it
        (``plan_attention``).
        """
        hidden, cos, sin, attend = self._prepare(input_ids, position_ids, mask, cache, visible)
        count = self._config.num_hidden_layers
        layer_ids = tuple(sorted({i for i in features if i < count})) if isinstance(features, tuple) else ()
        native = None if self.native is None else self.native(hidden, cos, sin, attend, cache, layer_ids)
        if native is not None:  # every layer run in C++, bit-identical to the loop below
            hidden, kept = native
            states = dict(zip(layer_ids, kept, strict=True))  # transformers' hidden_states, those asked for
        else:
            states = {}
            for i, layer in enumerate(self._layers[:count]):
                if i in layer_ids:
                    states[i] = hidden
                hidden = layer(hidden, cos, sin, attend, cache)
        hidden = self._norm_fn(hidden, *self._norm)
        logits = self._linear(hidden[:, -keep:, :], *self._head)
        if isinstance(features, tuple):
            states[count] = hidden
            return logits, torch.cat([states[i] for i in features], dim=-1)
        return logits, (hidden if features else None)

    def skipping(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, cache,
                 kept: Sequence[tuple[bool, bool]]) -> torch.Tensor:
        """(1, q, H) the final-normed hidden state with only the kept sub-layers run: ``kept[i]`` says whether layer
        i's attention and its MLP run (self-speculation's draft; arguments as ``__call__``'s). Skipped attention
        sub-layers write nothing to ``cache``."""
        hidden, cos, sin, attend = self._prepare(input_ids, position_ids, mask, cache)
        for layer, (attention, mlp) in zip(self._layers, kept, strict=True):
            if attention:
                hidden = layer.attention_block(hidden, cos, sin, attend, cache)
            if mlp:
                hidden = layer.mlp_block(hidden)
        return self._norm_fn(hidden, *self._norm)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., V) logits of final-normed hidden states, multiplied as the target's own passes are."""
        return self._linear(hidden, *self._head)

    def _prepare(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, cache,
                 visible: torch.Tensor | None = None):
        """The embedded ids (1, q, H), rope's cos and sin, and the pass's attention plan."""
        q_len = input_ids.shape[1]
        if mask is None and q_len > 1 and cache.get_seq_length() > 0:
            raise ValueError("a pass of several tokens over a non-empty cache needs a mask")
        hidden = self._embed(input_ids)  # (1, q, H)
        cos, sin = self._rope(self._rotary, hidden, position_ids)
        attend = plan_attention(mask, q_len, self._groups, self._probe, masked_gqa=self._linear is not F.linear,
                                pack_queries=self.pack_queries,
                                kernel=None if torch.is_grad_enabled() else self.attention,  # no autograd
                                visible=visible)
        if self.rotate is not None:
            attend = replace(attend, rotate=self.rotate)
        return hidden, cos, sin, attend
