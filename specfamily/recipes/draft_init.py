"""A small draft model for a large-vocabulary target, and the token arrays to distil it on.

The draft's embedding (tied to its head) starts as the target embedding's best rank-h approximation, ``E V_h`` with
V_h from the SVD of the centred embedding; the layers start random. ``specfamily-zoo draft-init`` writes that model
(with the target's tokenizer) for ``specfamily-zoo train --kind draft --init-from``; ``specfamily-zoo
distill-workdir`` writes distillation conversations as the ``train.npy`` / ``heldout.npy`` arrays the trainer reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specfamily.io.files import write_atomically, write_folder_atomically


@dataclass(frozen=True)
class DraftShape:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 768


def principal_embedding(embedding: torch.Tensor, hidden: int) -> torch.Tensor:
    """(V, hidden): the embedding's coordinates on its top-``hidden`` principal directions, rescaled so each row
    keeps the target's average row norm."""
    if not 0 < hidden <= embedding.shape[1]:
        raise ValueError(f"a draft hidden size must be in 1..{embedding.shape[1]}, got {hidden}")
    weight = embedding.float()
    centred = weight - weight.mean(0, keepdim=True)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)  # v: (H, H), rows are directions
    reduced = weight @ v[:hidden].T
    return reduced * (weight.norm(dim=1).mean() / reduced.norm(dim=1).mean())


def draft_config(target_config, shape: DraftShape) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=target_config.vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=target_config.max_position_embeddings, tie_word_embeddings=True,
        rope_parameters=getattr(target_config, "rope_parameters", None), rms_norm_eps=target_config.rms_norm_eps,
        bos_token_id=target_config.bos_token_id, eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id, attn_implementation="sdpa",
    )


def init_draft(target, out: str | Path, shape: DraftShape = DraftShape(), seed: int = 0) -> Path:
    """Write a draft for ``target`` (a specfamily Target) whose tied embedding is the principal one."""
    config = draft_config(target.model.config.get_text_config(decoder=True), shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(principal_embedding(target.model.get_input_embeddings().weight,
                                                                      shape.hidden))

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        target.tokenizer.save_pretrained(str(tmp))

    return write_folder_atomically(out, fill)


def distill_workdir(data: str | Path, target, workdir: str | Path) -> dict:
    """``workdir``/train.npy and heldout.npy (uint16 conversations back to back) and ``workdir``/tokenizer."""
    from specfamily.train.distilled import load_distilled

    if target.vocab_size > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"a vocabulary of {target.vocab_size} does not fit uint16 token arrays")
    train, heldout = load_distilled(data)
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("heldout", heldout)):
        array = part.tokens.numpy().astype(np.uint16)
        write_atomically(work / f"{name}.npy", lambda tmp, a=array: np.save(tmp, a))
    write_folder_atomically(work / "tokenizer", lambda tmp: target.tokenizer.save_pretrained(str(tmp)))
    return {"train_tokens": int(train.tokens.numel()), "heldout_tokens": int(heldout.tokens.numel()),
            "conversations": len(train) + len(heldout)}
