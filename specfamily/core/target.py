"""The target model wrapper: one forward over the pending tokens plus a draft chain or tree, and KV rollback.

The cache holds every committed token except the last one (the root). ``forward`` feeds the pending tokens (the
root last) and the draft nodes in one model call; ``commit`` keeps the pending tokens and the accepted path.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from specfamily import zoo
from specfamily.core.side_rows import SideRows, side_key, side_layout
from specfamily.core.support import SUPPORTED_ATTENTION, check_supported, eos_ids
from specfamily.core.target_cache import check_draft_tokens, check_path, keep_path, truncate
from specfamily.core.tree_mask import TreeLayout, tree_layout
from specfamily.core.types import Draft
from specfamily.io.sources import is_local, unreachable_model
from specfamily.runtime.attention import attention_for
from specfamily.runtime.compiled_pass import CompiledPass, compile_kind, compiled_pass
from specfamily.runtime.kv_cache import KVArena
from specfamily.runtime.lean import LeanLlama
from specfamily.runtime.lean_support import lean_unsupported
from specfamily.runtime.matmul import MatmulChoice, choose_matmul, linear_for
from specfamily.runtime.native_layers import native_layers as attach_native

__all__ = ["SUPPORTED_ATTENTION", "Target", "TargetOutput", "check_supported", "load_target"]

_LAYOUT_CACHE_SIZE = 64
_LAYOUT_CACHE_MAX_TOKENS = 256  # pending + nodes; larger local masks (long prompts) are built and not kept


@dataclass
class TargetOutput:
    """What one target pass returns (inference-mode tensors: clone them before using them in autograd)."""

    logits: torch.Tensor  # (n + 1, V): row 0 at the root (last pending token), row i + 1 after draft node i
    # (m + n, H): last hidden state after the final norm, every fed position; (m + n, k * H) for k feature layers
    features: torch.Tensor | None = None
    side_logits: torch.Tensor | None = None  # (s, V) at the draft's side rows (never verified); None without them


@dataclass(frozen=True)
class _Pass:
    """The shape of the last forward, needed by ``commit``."""

    start: int  # cached length before the pass
    m: int
    parents: tuple[int, ...]
    side: int = 0  # side rows fed after the draft (dropped by commit)


class Target:
    """A causal LM with a KV cache that can score a draft tree in one pass and roll back to the accepted path."""

    def __init__(self, model: PreTrainedModel, tokenizer=None, fast: bool = True, matmul: str = "exact",
                 compile: bool | str = False, native_layers: bool = True,
                 native_attention: bool | str = "auto") -> None:
        """``fast``: use the lean forward (``specfamily.runtime.kv_cache``) where it reproduces the model exactly.

        ``matmul`` (lean forward only): ``exact`` multiplies as transformers does (bit-identical logits), ``skinny``
        and ``stream`` (a streaming C++ kernel) in other float32 orders that are faster on some CPUs, ``auto`` the
        fastest measured here (``specfamily.runtime.matmul``). ``self.matmul`` is the kind in use,
        ``self.matmul_choice`` the choice with auto's timings. ``compile`` (lean forward only, off by default):
        ``torch.compile`` the rope (``specfamily.runtime.compiled``), or with ``"pass"`` the decode and verify passes
        (``specfamily.runtime.compiled_pass``), eager where it does not apply or fails. ``native_layers`` (with the
        stream kernel): the layer loop in C++, bit-identical (``specfamily.runtime.native_layers``).
        ``native_attention`` (with the stream kernel; ``"auto"``: where it runs vectorised): decode and verify passes
        attend with a batch-invariant C++ kernel in both loops (``specfamily.runtime.attention``)."""
        check_supported(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        text_config = model.config.get_text_config(decoder=True)
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size: int = int(text_config.hidden_size)
        self.num_layers: int = int(text_config.num_hidden_layers)
        self.eos_token_ids: tuple[int, ...] = eos_ids(model, tokenizer, self.vocab_size)
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_logits = "logits_to_keep" in params
        self.verify_costs: dict[int, float] | None = None  # t(g + 1) / t(1) by g, measured on first need (core.costs)
        self.batch_pass_costs: dict = {}  # (B, N) -> the latest batched passes' (seconds, contexts) (core.batch_costs)
        self.batch_realized: dict = {}  # drafter class -> B -> drafted passes' gains (core.batch_goodput.kept_realized)
        self.batch_draft_steps: dict = {}  # drafter class -> B -> a batched draft step's seconds (core.batch_costs)
        self._layouts: OrderedDict[tuple, TreeLayout] = OrderedDict()  # by (m, parents, device, dtype)
        lean = fast and lean_unsupported(model) is None
        self.matmul_choice: MatmulChoice = choose_matmul(matmul, model if lean else None)  # auto's timings with it
        self.matmul: str = self.matmul_choice.kind  # the model's own forward (no lean one) multiplies exactly
        rope_only = compile_kind(compile) == "rope"
        self.lean: LeanLlama | None = LeanLlama(model, linear_for(self.matmul), rope_only) if lean else None
        self.compiled_pass: CompiledPass | None = compiled_pass(self.lean, compile)  # compile="pass"
        if self.lean is not None:
            self.lean.attention = attention_for(self.lean, native_attention)
            self.lean.native = attach_native(self.lean, native_layers)
        self.reset()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def reset(self) -> None:
        """Start a new request: an empty cache (a DynamicCache whose layers append in place)."""
        self.cache = DynamicCache(config=self.model.config)
        arena = KVArena()  # every layer's buffers in one tensor: a tree's commit moves entries in one copy
        self.cache.layers = [arena.layer() for _ in self.cache.layers]
        self.cached_length = 0
        self._device = self.model.device  # read once per request: the property walks the parameters
        self._dtype = self.model.dtype
        self._last: _Pass | None = None

    def check_ids(self, ids) -> torch.Tensor:
        """A validated (L,) long tensor of token ids on the model's device; (1, L) is accepted too."""
        if not isinstance(ids, torch.Tensor):
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
                raise TypeError(f"token ids must be a 1-D sequence of ints or a tensor, got {type(ids).__name__}")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise TypeError("token ids must be integers")
            ids = torch.tensor(list(ids), dtype=torch.long)
        elif ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1:
            raise ValueError(f"token ids must be 1-D (batch size 1), got shape {tuple(ids.shape)}")
        if ids.numel() == 0:
            raise ValueError("prompt is empty")
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.numel():
            raise ValueError(f"token id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})")
        return ids.to(device=self.device, dtype=torch.long)

    @torch.inference_mode()
    def forward(
        self, pending: torch.Tensor, draft: Draft | None = None, features: bool | tuple[int, ...] = False
    ) -> TargetOutput:
        """Score the pending tokens (the root last) and a draft tree over them in one model call.

        ``features``: True for the last hidden state after the final norm at every fed position; a tuple of layer
        ids (:meth:`check_feature_layers`) for those layers' hidden states concatenated (EAGLE-3's low, middle and
        high features)."""
        if isinstance(features, tuple):
            self.check_feature_layers(features)
        if self._last is not None:
            raise RuntimeError("commit() the previous forward before the next one")
        if pending.dim() != 1 or pending.numel() == 0:
            raise ValueError(f"pending must be a non-empty 1-D tensor of token ids, got shape {tuple(pending.shape)}")
        if pending.dtype != torch.long:
            raise TypeError(f"pending must be a long tensor, got {pending.dtype}")
        m, start = pending.numel(), self.cached_length
        parents: tuple[int, ...] = tuple(draft.parents.tolist()) if draft is not None else ()  # host tensor
        n = len(parents)
        side = draft.side if draft is not None else None
        if n:
            check_draft_tokens(draft.tokens, self.vocab_size)
        ids = pending.to(self._device)
        if n:
            ids = torch.cat((ids, draft.tokens.to(self._device, non_blocking=True)))  # (m + n,)
        if side is not None:
            return self._side_pass(ids, m, start, parents, side, features)
        visible = None  # where the mask is 0, for the lean forward's attention kernel (built from the layout)
        if n or start:
            layout = self._layout(m, parents)
            # one fed token sees every cached position and itself: no mask, as transformers decodes
            mask = layout.mask(start) if m + n > 1 else None  # (1, 1, m + n, start + m + n), a buffer's view
            positions = layout.offsets + start  # (m + n,)
            if mask is not None and self.lean is not None and self.lean.attention is not None:
                visible = layout.visible(start)
        else:  # prefill without a draft: plain causal, which transformers may hand to sdpa as is_causal
            mask = None
            positions = torch.arange(m, device=self.device)
        try:
            logits, hidden = self._model_call(ids[None], positions[None], mask, n + 1, features, visible)
        except BaseException:
            truncate(self.cache, start)  # a failed pass (bad id, out of memory) leaves the cache as it was
            raise
        self._last = _Pass(start, m, parents)
        feats = hidden[0] if features else None  # (m + n, H) after the final norm, or (m + n, k * H)
        return TargetOutput(logits[0, -(n + 1) :], feats)

    def _side_pass(self, ids: torch.Tensor, m: int, start: int, parents: tuple[int, ...], side: SideRows,
                   features: bool | tuple[int, ...]) -> TargetOutput:
        """``forward`` for a draft with side rows (``specfamily.core.side_rows``): fed after the tree, masked off it,
        their logits returned apart and their cache entries dropped by ``commit``."""
        check_draft_tokens(side.tokens, self.vocab_size)
        n, s = len(parents), len(side)
        ids = torch.cat((ids, side.tokens.to(self._device, non_blocking=True)))  # (m + n + s,)
        layout = self._layout(m, parents, side)
        try:
            logits, hidden = self._model_call(ids[None], (layout.offsets + start)[None], layout.mask(start), n + 1 + s,
                                              features)
        except BaseException:
            truncate(self.cache, start)
            raise
        self._last = _Pass(start, m, parents, s)
        feats = hidden[0, : m + n] if features else None
        return TargetOutput(logits[0, -(n + 1 + s) : -s], feats, logits[0, -s:])

    def check_feature_layers(self, layers: tuple[int, ...]) -> tuple[int, ...]:
        """Layer ids a drafter may ask features of, as transformers indexes ``hidden_states``: 0 the embeddings,
        i < L the input of decoder layer i (the output of layer i - 1), L the last hidden state after the final
        norm. A ValueError names the ids outside [0, L]."""
        if not layers or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
            raise ValueError(f"feature layers must be a non-empty tuple of layer ids, got {layers!r}")
        bad = [i for i in layers if not 0 <= i <= self.num_layers]
        if bad:
            raise ValueError(f"feature layers {list(layers)}: {bad} outside [0, {self.num_layers}] for a target "
                             f"of {self.num_layers} layers")
        return layers

    def _model_call(self, ids, positions, mask, keep: int, features: bool | tuple[int, ...],
                    visible: torch.Tensor | None = None):
        """(logits (1, >= keep, V), last hidden state after the final norm (1, q, H) or the layers' (1, q, k * H),
        or None): lean or the model. ``visible``: where ``mask`` is 0 (``TreeLayout.visible``), or None."""
        if self.lean is not None and self.lean.ready():
            taken = self.compiled_pass and self.compiled_pass(ids, positions, mask, self.cache, keep, features)
            return taken or self.lean(ids, positions, mask, self.cache, keep, features, visible)
        extra = {"logits_to_keep": keep} if self._keep_logits else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            output_hidden_states=bool(features),
            **{self._cache_kw: self.cache},
            **extra,
        )
        if isinstance(features, tuple):
            return out.logits, torch.cat([out.hidden_states[i] for i in features], dim=-1)
        return out.logits, (out.hidden_states[-1] if features else None)

    @torch.inference_mode()
    def commit(self, accepted_nodes: Sequence[int]) -> None:
        """Keep in the cache the pending tokens of the last forward and the accepted nodes (root down)."""
        last = self._last
        if last is None:
            raise RuntimeError("commit() needs a forward() first")
        accepted = list(accepted_nodes)
        check_path(accepted, last.parents)
        base, k = last.start + last.m, len(accepted)
        kept = next((i for i, node in enumerate(accepted) if node != i), k)  # the path's prefix already in place
        # rewrite only the entries that move (accepted[kept:] to base + kept ...), then crop unless the cache holds
        # exactly the pending tokens and the whole draft
        crop = k < len(last.parents) or last.side
        if kept < k or crop:
            keep_path(self.cache, base + kept, [base + node for node in accepted[kept:]], base + k if crop else None)
        self.cached_length = base + k
        self._last = None

    def rollback(self, length: int) -> None:
        """Forget every cached token at or after ``length`` (a drafter's own model undoing rejected tokens)."""
        if self._last is not None:
            raise RuntimeError("commit() the last forward before rolling back")
        if not 0 <= length <= self.cached_length:
            raise ValueError(f"cannot roll back to {length} tokens: {self.cached_length} are cached")
        truncate(self.cache, length)
        self.cached_length = length

    def _layout(self, m: int, parents: tuple[int, ...], side: SideRows | None = None) -> TreeLayout:
        """The mask block and position offsets for this shape on this device and dtype, kept for small shapes."""
        key = (m, parents, self._device, self._dtype)  # a model moved or cast between requests gets fresh masks
        if side is not None:
            key += side_key(side)
        layout = self._layouts.get(key)
        if layout is not None:
            self._layouts.move_to_end(key)
            return layout
        if side is None:
            layout = tree_layout(m, parents, self._dtype, self._device)
        else:
            layout = side_layout(m, parents, side, self._dtype, self._device)
        if m + len(parents) + (0 if side is None else len(side)) <= _LAYOUT_CACHE_MAX_TOKENS:
            self._layouts[key] = layout
            if len(self._layouts) > _LAYOUT_CACHE_SIZE:
                self._layouts.popitem(last=False)
        return layout

    def __repr__(self) -> str:
        return (
            f"Target({type(self.model).__name__}, vocab_size={self.vocab_size}, layers={self.num_layers}, "
            f"device={self.device}, dtype={self.dtype}, cached_length={self.cached_length})"
        )


def load_target(
    name_or_model: str | Path | PreTrainedModel,
    tokenizer=None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    matmul: str = "exact",
    compile: bool | str = False,
) -> Target:
    """A Target from a built model, a ``zoo:`` name, a local folder or a hub name (``matmul``, ``compile``: see
    ``Target``)."""
    if isinstance(name_or_model, PreTrainedModel):
        model = name_or_model
        if device is not None:
            model = model.to(device)
        if dtype is not None:
            model = model.to(dtype)
        return Target(model, tokenizer, matmul=matmul, compile=compile)
    if not isinstance(name_or_model, (str, Path)):
        raise TypeError(f"load_target takes a model name, a path or a PreTrainedModel, got {type(name_or_model)}")
    source = _resolve(name_or_model)
    device = torch.device(device) if device is not None else _default_device()
    model = _load_model(source, device, dtype)
    if tokenizer is None:
        tokenizer = _load_tokenizer(source)
    return Target(model, tokenizer, matmul=matmul, compile=compile)


def _resolve(name: str | Path) -> str:
    """A ``zoo:`` name becomes its folder (shipped, or fetched into the user's cache on first use); other names and
    paths pass through."""
    return str(zoo.resolve(name))


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _load_model(source: str, device: torch.device, dtype: torch.dtype | None) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else "auto"
    try:
        # use_kernels=False: transformers >= 5.25 kernelizes by default when the ``kernels`` package is installed (it
        # now depends on it), and a kernelized model is no longer the plain modules the lean forward reproduces
        # device_map: off the CPU the weights load straight onto the device (never a float32 copy on the host first)
        placement = {} if device.type == "cpu" else {"device_map": str(device)}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="sdpa", use_kernels=False,
                                                     **placement)
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):
            raise ValueError(f"{source!r} is not a causal language model: {err}") from err
        raise
    except OSError as err:
        if is_local(source):
            raise
        raise unreachable_model(source, err) from None
    return model.to(device)


def _load_tokenizer(source: str):
    """The tokenizer saved with the model, or None when there is none."""
    from transformers import AutoTokenizer

    folder = Path(source)
    if folder.is_dir() and not any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    ):
        return None
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError):
        return None
