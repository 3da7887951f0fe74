"""The target wrapper against plain full-sequence forwards of the same model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, BertModel, MistralConfig

from specfamily.core.target import Target, load_target
from specfamily.core.tree_mask import attention_mask, local_mask, tree_ancestors, tree_mask, tree_positions
from specfamily.core.types import Draft

TREE = [-1, -1, 0, 0, 1, 2]  # two root children; node 5 at depth 3
ATOL = 1e-5


def reference(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain forward without a cache: logits (L, V) and the hidden state after the final norm (L, H)."""
    with torch.inference_mode():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0]


def path_to(node: int, parents: list[int], tokens: list[int]) -> list[int]:
    """Tokens from the root's first child down to ``node``."""
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_tree_rows(model, out, context: list[int], tokens: list[int], parents: list[int]) -> None:
    """Row 0 is the plain forward of ``context``; row i + 1 that of context + path to node i."""
    logits, _ = reference(model, context)
    torch.testing.assert_close(out.logits[0], logits[-1], atol=ATOL, rtol=1e-5)
    for i in range(len(tokens)):
        logits, _ = reference(model, context + path_to(i, parents, tokens))
        torch.testing.assert_close(out.logits[i + 1], logits[-1], atol=ATOL, rtol=1e-5)


# ---------------------------------------------------------------- tree helpers


def test_tree_positions_and_mask():
    assert tree_positions(TREE).tolist() == [1, 1, 2, 2, 2, 3]
    visible = tree_ancestors(TREE)
    assert visible[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert visible[4].nonzero().flatten().tolist() == [1, 4]
    mask = tree_mask(TREE, torch.float16)
    assert mask.dtype == torch.float16 and mask[5, 0] == 0 and mask[5, 1] == torch.finfo(torch.float16).min
    assert tree_positions([]).shape == (0,)
    assert tree_positions([-1, 0, 1, 2, 3, 4, 5, 6, 7]).tolist() == list(range(1, 10))  # closure reaches far


def test_local_and_full_mask():
    local = local_mask(2, [-1, -1], torch.float32)  # 2 pending then two root children
    visible = (local == 0).int().tolist()
    assert visible == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    full = attention_mask(3, local)
    assert full.shape == (1, 1, 4, 7) and bool((full[0, 0, :, :3] == 0).all())


# ---------------------------------------------------------------- forward


def test_chain_first_pass_matches_plain_forward(any_tiny_model):
    model = any_tiny_model
    target = Target(model)
    prompt, chain = random_tokens(7, 1), random_tokens(4, 2)
    out = target.forward(torch.tensor(prompt), Draft.chain(chain), features=True)
    logits, hidden = reference(model, prompt + chain)
    assert out.logits.shape == (5, 50) and out.features.shape == (11, 32)
    torch.testing.assert_close(out.logits, logits[-5:], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out.features, hidden, atol=ATOL, rtol=1e-5)


def test_features_are_after_final_norm(any_tiny_model):
    model = any_tiny_model
    target = Target(model)
    out = target.forward(ids(3, 4, 5), features=True)
    with torch.inference_mode():
        logits = model.get_output_embeddings()(out.features)  # the LM head reads exactly these
    torch.testing.assert_close(out.logits[0], logits[-1], atol=ATOL, rtol=1e-5)


def test_tree_first_pass_matches_plain_forward(any_tiny_model):
    model = any_tiny_model
    target = Target(model)
    prompt, tokens = random_tokens(5, 3), random_tokens(len(TREE), 4)
    out = target.forward(torch.tensor(prompt), Draft(tokens, TREE), features=True)
    assert out.logits.shape == (len(TREE) + 1, 50)
    assert_tree_rows(model, out, prompt, tokens, TREE)
    _, hidden = reference(model, prompt + path_to(5, TREE, tokens))
    torch.testing.assert_close(out.features[5 + 5], hidden[-1], atol=ATOL, rtol=1e-5)


def test_tree_mask_is_not_a_chain_mask(tiny_model):
    """Control: node 4 (child of 1) must not see nodes 0, 2, 3; a causal mask would give other logits."""
    model = tiny_model("llama")
    prompt, tokens = random_tokens(5, 3), random_tokens(len(TREE), 4)
    out = Target(model).forward(torch.tensor(prompt), Draft(tokens, TREE))
    chain_logits, _ = reference(model, prompt + tokens[:5])
    assert (out.logits[5] - chain_logits[-1]).abs().max() > 1e-3


# ---------------------------------------------------------------- commit and rollback


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([([-1, 0, 1, 2], [0, 1, 2]), ([-1, 0, 1], []), ([-1, 0, 1, 2], [0, 1, 2, 3])], id="chain-crop"),
        pytest.param([(TREE, [1, 4]), (TREE, [0, 2, 5]), (TREE, [0]), (TREE, [])], id="tree-rewrite"),
        pytest.param([(TREE, [0, 3]), ([-1, 0, 1], [0, 1]), ([], []), (TREE, [1])], id="mixed"),
    ],
)
def test_commit_then_forward_matches_plain_forward(any_tiny_model, steps):
    model = any_tiny_model
    target = Target(model)
    committed = random_tokens(6, 5)
    pending = list(committed)
    for step, (parents, accepted) in enumerate(steps):
        tokens = random_tokens(len(parents), 10 + step)
        draft = Draft(tokens, parents) if parents else None
        out = target.forward(torch.tensor(pending), draft, features=True)
        assert_tree_rows(model, out, committed, tokens, parents)
        target.commit(accepted)
        bonus = random_tokens(1, 20 + step)
        committed += [tokens[a] for a in accepted] + bonus
        pending = bonus
        assert target.cached_length == len(committed) - 1 == target.cache.get_seq_length()
    out = target.forward(torch.tensor(pending), features=True)
    logits, hidden = reference(model, committed)
    torch.testing.assert_close(out.logits[0], logits[-1], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out.features[0], hidden[-1], atol=ATOL, rtol=1e-5)


def test_several_pending_after_prefill(tiny_model):
    """m > 1 with a cache already present (e.g. after a rejected-bonus replay) and a tree draft."""
    model = tiny_model("gpt2")
    target = Target(model)
    target.forward(ids(1, 2, 3))
    target.commit([])
    tokens = random_tokens(len(TREE), 6)
    out = target.forward(ids(4, 5, 6), Draft(tokens, TREE))
    assert target.cached_length == 3  # the first root stays cached; 4 is the next committed token
    assert_tree_rows(model, out, [1, 2, 3, 4, 5, 6], tokens, TREE)


def test_several_pending_without_draft(tiny_model):
    model = tiny_model("llama", attn="eager")
    target = Target(model)
    target.forward(ids(1, 2, 3))
    target.commit([])
    out = target.forward(ids(4, 5, 6), features=True)
    logits, hidden = reference(model, [1, 2, 3, 4, 5, 6])
    torch.testing.assert_close(out.logits[0], logits[-1], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out.features, hidden[3:], atol=ATOL, rtol=1e-5)


def test_reset_starts_a_new_request(tiny_model):
    model = tiny_model("llama")
    target = Target(model)
    target.forward(ids(7, 8, 9))
    target.commit([])
    target.reset()
    assert target.cached_length == 0 and target.cache.get_seq_length() == 0
    out = target.forward(ids(1, 2))
    torch.testing.assert_close(out.logits[0], reference(model, [1, 2])[0][-1], atol=ATOL, rtol=1e-5)


def test_commit_misuse(tiny_model):
    target = Target(tiny_model("gpt2"))
    with pytest.raises(RuntimeError, match="forward"):
        target.commit([])
    target.forward(ids(1, 2), Draft([3, 4, 5], [-1, -1, 0]))
    with pytest.raises(RuntimeError, match="commit"):
        target.forward(ids(1))
    with pytest.raises(ValueError, match="not a path"):
        target.commit([1, 2])  # node 2 is a child of 0
    with pytest.raises(ValueError, match="not a path"):
        target.commit([3])
    target.commit([0, 2])
    assert target.cached_length == 4
    with pytest.raises(ValueError, match="draft token id 99 is outside"):
        target.forward(ids(1), Draft([99], [-1]))  # outside the vocabulary: refused, the cache is left as it was
    assert target.cache.get_seq_length() == 4
    target.forward(ids(1))


# ---------------------------------------------------------------- input checks and refusals


def test_check_ids(tiny_model):
    target = Target(tiny_model("gpt2"))
    assert target.check_ids([1, 2, 3]).tolist() == [1, 2, 3]
    assert target.check_ids(torch.tensor([[4, 5]])).tolist() == [4, 5]
    assert target.check_ids(torch.tensor([6], dtype=torch.int32)).dtype == torch.long
    with pytest.raises(ValueError, match="prompt is empty"):
        target.check_ids([])
    with pytest.raises(ValueError, match=r"token id 50 .*\[0, 50\)"):
        target.check_ids([1, 50])
    with pytest.raises(ValueError, match="token id -1"):
        target.check_ids(torch.tensor([-1]))
    with pytest.raises(TypeError):
        target.check_ids(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        target.check_ids("abc")
    with pytest.raises(ValueError, match="1-D"):
        target.check_ids(torch.zeros(2, 3, dtype=torch.long))


def test_refuses_flash_attention(tiny_model):
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2.*not supported"):
        Target(model)


def test_refuses_flex_attention(tiny_model):
    with pytest.raises(ValueError, match="flex_attention.*not supported"):
        Target(tiny_model("llama", attn="flex_attention"))


def test_refuses_sliding_window():
    config = MistralConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=50,
        sliding_window=16,
    )
    with pytest.raises(ValueError, match="sliding_window=16.*not supported"):
        Target(AutoModelForCausalLM.from_config(config))


def test_refuses_hybrid_layer_types(tiny_model):
    model = tiny_model("llama")
    model.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="sliding_attention"):
        Target(model)


def test_refuses_non_causal_models():
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    with pytest.raises(ValueError, match="not a causal language model"):
        Target(bert)
    with pytest.raises(TypeError):
        load_target(object())


# ---------------------------------------------------------------- loading


def test_load_target_from_model_and_folder(tiny_model, tmp_path):
    model = tiny_model("llama", attn="eager")
    target = load_target(model)
    assert target.model is model and target.tokenizer is None
    assert (target.vocab_size, target.hidden_size, target.num_layers) == (50, 32, 2)
    model.save_pretrained(tmp_path)
    loaded = load_target(str(tmp_path), device="cpu")
    assert loaded.model.config._attn_implementation == "sdpa" and loaded.dtype == torch.float32
    assert loaded.tokenizer is None
    a = target.forward(ids(1, 2, 3)).logits
    b = loaded.forward(ids(1, 2, 3)).logits
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-5)


def test_eos_inside_vocabulary(tiny_model):
    assert Target(tiny_model("gpt2")).eos_token_id is None  # GPT-2's 50256 is outside the tiny vocabulary
    assert Target(tiny_model("llama", eos_token_id=2)).eos_token_id == 2


def test_rollback_forgets_tokens_as_if_never_fed():
    from specfamily.testing import tiny_target

    target = tiny_target("llama", vocab_size=16)
    ids = torch.tensor([1, 2, 3, 4, 5])
    target.forward(ids)
    target.commit([])
    target.forward(torch.tensor([6]))
    target.commit([])
    target.rollback(3)
    assert target.cached_length == 3
    again = target.forward(torch.tensor([9, 7])).logits
    target.commit([])
    fresh = tiny_target("llama", vocab_size=16)
    expected = fresh.forward(torch.tensor([1, 2, 3, 9, 7])).logits
    torch.testing.assert_close(again, expected)
    with pytest.raises(ValueError, match="cannot roll back to 9 tokens: 5 are cached"):
        target.rollback(9)
    target.forward(torch.tensor([1]))
    with pytest.raises(RuntimeError, match="commit\\(\\) the last forward before rolling back"):
        target.rollback(1)


@pytest.mark.parametrize("fast", [True, False])
def test_a_tree_commit_in_the_arena_leaves_the_cache_of_per_layer_buffers(tiny_model, fast):
    """The target's layers share one arena (a tree's commit moves every layer's entries in one copy): the cache it
    leaves, and the passes after it, equal those of per-layer buffers, entry for entry."""
    from specfamily.runtime.kv_cache import BufferedLayer, shared_arena

    model = tiny_model("llama")
    arena, alone = Target(model, fast=fast), Target(model, fast=fast)
    alone.cache.layers = [BufferedLayer() for _ in alone.cache.layers]
    tokens = torch.tensor([1, 2, 3, 4, 5, 6])
    for target in (arena, alone):
        target.forward(torch.arange(90) % 50)  # past the first buffers' 64 spare entries later on
        target.commit([])
        for _ in range(3):
            target.forward(torch.tensor([7]), Draft(tokens, torch.tensor(TREE)))
            target.commit([1, 4])  # both entries move
    assert shared_arena(arena.cache.layers) is not None and shared_arena(alone.cache.layers) is None
    for a, b in zip(arena.cache.layers, alone.cache.layers, strict=True):
        assert a.keys.shape[-2] == 99 and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    chain = Draft.chain(torch.arange(60) % 50)  # past the capacity: the arena grows with every layer's entries
    outs = [target.forward(torch.tensor([8]), chain).logits for target in (arena, alone)]
    assert torch.equal(*outs)
    for target in (arena, alone):
        target.commit(list(range(30)))
    for a, b in zip(arena.cache.layers, alone.cache.layers, strict=True):
        assert a.keys.shape[-2] == 130 and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
