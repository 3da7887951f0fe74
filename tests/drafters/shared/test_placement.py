"""An 8B target and every registered drafter, laid out on the ``meta`` device in bfloat16 with the shapes of
published checkpoints: each drafter's own modules are built where the target lives and in its dtype (nothing is
materialised on the host in float32 first), and a target loaded by name off the CPU asks transformers to place its
weights on the device (``device_map``)."""

from __future__ import annotations

import tempfile

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import LlamaConfig, LlamaForCausalLM

import specfamily as sf
from specfamily.core.target import load_target
from specfamily.drafters.shared.placement import built_like, forked_rng

LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256)
LLAMA32_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=128256)


def meta_llama(shape: dict) -> LlamaForCausalLM:
    config = LlamaConfig(**shape, max_position_embeddings=8192, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    config._attn_implementation = "sdpa"
    with built_like("meta", torch.bfloat16):
        return LlamaForCausalLM(config).eval()


# the options that give each family a published checkpoint's shape for a Llama-3-8B target; a family missing here
# fails test_every_registered_drafter_has_a_published_shape (add its shape when it is registered)
PUBLISHED = {
    "prompt_lookup": lambda: {},
    "suffix": lambda: {},
    "self_spec": lambda: {"skip": ["attn:10", "mlp:12", "attn:20", "mlp:24"]},
    "medusa": lambda: {"weights": "random", "num_heads": 5, "layers": 1},  # Medusa-1's heads
    "eagle": lambda: {"weights": "random"},  # EAGLE(-2) for Llama-3-8B: one decoder layer, the whole vocabulary
    "eagle3": lambda: {"weights": "random", "draft_vocab": list(range(32000))},  # EAGLE-3: 32000-token draft vocab
    "small_model": lambda: {"model": meta_llama(LLAMA32_1B)},  # Llama-3.2-1B drafting for Llama-3-8B
    "hydra": lambda: {"weights": "random", "num_heads": 5, "layers": 1},  # Hydra's heads, Medusa-1's count
    "lookahead": lambda: {"window": 4, "ngram": 4, "guesses": 4},  # no weights, side rows in the target's own pass
    "recycling": lambda: {"template": "2.2.2"},  # the reference's 2.2.2 template, its first nodes
    "rest": lambda: {"datastore": _datastore()},
    "merge": lambda: {"parts": ["suffix", "eagle3"],  # SAM-Decoding's pairing: a suffix index and an EAGLE head
                      "options": {"eagle3": {"weights": "random", "draft_vocab": list(range(32000))}}},
}
OWN_WEIGHTS = {  # at least this many drafter parameters were checked
    "medusa": 5 * 4096 * (4096 + 128256), "eagle": 200_000_000, "eagle3": 200_000_000, "small_model": 1_000_000_000,
    "merge": 200_000_000, "hydra": 5 * 4096 * 4096,
}


class HostFloat32(TorchDispatchMode):
    """Records the largest float32 tensor any op inside makes on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and tensor.dtype == torch.float32:
                self.largest = max(self.largest, tensor.numel())
        return out


def _datastore() -> str:
    """A small REST datastore over a Llama-3 vocabulary (the drafter opens it; no weights)."""
    from specfamily.drafters.rest.datastore import build_datastore

    sequences = [[(7 * i + j) % LLAMA3_8B["vocab_size"] for j in range(40)] for i in range(8)]
    return str(build_datastore(sequences, tempfile.mkdtemp(prefix="rest-"), LLAMA3_8B["vocab_size"], progress=False))


@pytest.fixture(scope="module")
def meta_target():
    return load_target(meta_llama(LLAMA3_8B))


def drafter_tensors(drafter, target) -> list[torch.Tensor]:
    """Every parameter and buffer of the modules a drafter holds (three attribute levels deep, through lists: a merge's
    parts), the target's own
    excluded (self_spec holds the target's blocks; their rotary buffers are float32 by transformers' design)."""
    own = {id(t) for t in (*target.model.parameters(), *target.model.buffers())}
    seen, tensors, frontier = {id(target.model)}, [], [drafter]
    for _ in range(3):
        found = []
        for holder in frontier:
            values = list(vars(holder).values()) if hasattr(holder, "__dict__") else []
            for value in values + [item for v in values if isinstance(v, list | tuple) for item in v]:
                if isinstance(value, torch.nn.Module) and id(value) not in seen:
                    seen.add(id(value))
                    tensors += [t for t in (*value.parameters(), *value.buffers()) if id(t) not in own]
                elif hasattr(value, "__dict__") and not isinstance(value, torch.Tensor | type):
                    if id(value) not in seen:
                        seen.add(id(value))
                        found.append(value)
        frontier = found
    return tensors


def test_every_registered_drafter_has_a_published_shape():
    assert set(sf.list_drafters()) <= set(PUBLISHED), set(sf.list_drafters()) - set(PUBLISHED)


@pytest.mark.parametrize("name", PUBLISHED)
def test_drafter_is_built_on_the_targets_device_in_its_dtype(meta_target, name):
    assert meta_target.device.type == "meta" and meta_target.dtype == torch.bfloat16
    options = PUBLISHED[name]()
    with HostFloat32() as host:
        drafter = sf.create_drafter(name, meta_target, **options)
    assert host.largest < 2**20, f"{name} made a float32 tensor of {host.largest} elements on the host"
    tensors = drafter_tensors(drafter, meta_target)
    assert {t.device.type for t in tensors} <= {"meta"}, {t.device for t in tensors}
    assert {t.dtype for t in tensors if t.is_floating_point()} <= {torch.bfloat16}
    weights = sum(t.numel() for t in tensors if t.is_floating_point())
    assert weights >= OWN_WEIGHTS.get(name, 0), weights


def test_built_like_restores_the_default_dtype_and_device():
    with built_like("meta", torch.bfloat16):
        inside = torch.nn.Linear(4, 4)
    outside = torch.nn.Linear(4, 4)
    assert (inside.weight.device.type, inside.weight.dtype) == ("meta", torch.bfloat16)
    assert (outside.weight.device.type, outside.weight.dtype) == ("cpu", torch.float32)


def test_a_seeded_build_leaves_the_callers_random_state():
    state = torch.random.get_rng_state()
    with forked_rng("cpu"):
        torch.manual_seed(123)
        torch.rand(3)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("device, placed", [("cpu", False), ("meta", True)])
def test_a_target_loaded_by_name_off_the_cpu_is_placed_by_transformers(monkeypatch, device, placed):
    from transformers import AutoModelForCausalLM

    calls, real = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    target = load_target("zoo:code-target", device=device, dtype=torch.bfloat16)
    assert (target.device.type, target.dtype) == (device, torch.bfloat16)
    assert ("device_map" in calls[0]) == placed and calls[0].get("device_map", device) == device
