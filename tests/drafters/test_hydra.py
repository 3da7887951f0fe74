"""Hydra heads (specfamily.drafters.medusa.hydra_*): sequential dependence, alignment, exactness, training."""

from dataclasses import replace

import pytest
import torch

import specfamily as sf
from specfamily.core.policy import make_policy
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.medusa.calibrate import target_features
from specfamily.drafters.medusa.checkpoint import MedusaCheckpoint
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.hydra_checkpoint import read_hydra, save_hydra
from specfamily.drafters.medusa.hydra_drafter import HydraDrafter, tree_levels
from specfamily.drafters.medusa.hydra_heads import HydraHeads, HydraShape, hydra_loss, hydra_rank_table, rank_accuracies
from specfamily.drafters.medusa.hydra_train import train
from specfamily.drafters.medusa.train_config import TrainConfig
from specfamily.drafters.medusa.tree import build_tree
from specfamily.io.identity import target_identity
from specfamily.recipes.distill import DistillConfig, write_batch
from specfamily.testing import SAMPLING_MATRIX, assert_lossless, tiny_target
from specfamily.train.distilled import is_heldout, load_distilled

PROMPT = [3, 1, 4, 1, 5]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)]
V = 64


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=V, spread=1.0, dtype=torch.float32)


def _perturbed(target, seed=0, scale=0.3, **options):
    drafter = HydraDrafter(target, weights="random", **options)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.heads.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return drafter


def _plain(target, prompt, n):
    return sf.generate(target, None, prompt, max_new_tokens=n).tokens


def test_untrained_hydra_heads_propose_what_untrained_medusa_heads_propose(target):
    """The grounding block starts as 'pick the feature', so a fresh Hydra head is a fresh Medusa head."""
    hydra = HydraDrafter(target, weights="random", tree=TREE)
    medusa = MedusaDrafter(target, weights="random", tree=TREE)
    features = target_features(target.model, torch.tensor([PROMPT]))[0]
    hydra_tokens = hydra.draft_tokens(features[-2], PROMPT[-1], 4)
    medusa_logits = medusa.heads(features[-2], 4)
    top = medusa_logits.topk(medusa.tree.top_k, dim=-1).indices.reshape(-1)
    assert hydra_tokens.tolist() == top[medusa.tree.gather].tolist()


def test_each_level_conditions_on_the_tokens_drafted_above_it(target):
    """Node tokens equal head d - 1 run by hand on (feature, root, path embeddings), and change with the path."""
    drafter = _perturbed(target, tree=TREE)
    heads = drafter.heads
    features = target_features(target.model, torch.tensor([PROMPT]))[0]
    feature, root = features[-2], PROMPT[-1]
    tokens = drafter.draft_tokens(feature, root, 4)
    paths = drafter.tree.paths
    index = {path: i for i, path in enumerate(paths)}
    for i, path in enumerate(paths):
        above = [tokens[index[path[:j]]] for j in range(1, len(path))]
        x = torch.cat([feature, heads.embed(torch.tensor([root, *above]).long()).reshape(-1)])
        expected = heads.head_logits(len(path) - 1, x).topk(path[-1] + 1).indices[path[-1]]
        assert int(tokens[i]) == int(expected), path
    # siblings (0, 0) and (1, 0) share a rank but not a parent token: the second head saw different inputs
    x0 = torch.cat([feature, heads.embed(torch.tensor([root, int(tokens[index[(0,)]])])).reshape(-1)])
    x1 = torch.cat([feature, heads.embed(torch.tensor([root, int(tokens[index[(1,)]])])).reshape(-1)])
    assert not torch.allclose(heads.head_logits(1, x0), heads.head_logits(1, x1))


def test_tree_levels_expand_only_nodes_with_children():
    levels = tree_levels(build_tree(TREE))
    assert [lv.ancestors.tolist() for lv in levels] == [[[]], [[0], [1]], [[0, 2]], [[0, 2, 5]]]
    assert [lv.rows.tolist() for lv in levels] == [[0, 0], [0, 0, 1], [0], [0]]
    assert [lv.top_k for lv in levels] == [2, 2, 1, 1]


def test_teacher_forced_forward_is_what_the_drafter_computes_on_a_chain(target):
    """forward(features, ids) at t with the true tokens equals draft_tokens' logits on a chain of the same tokens."""
    drafter = _perturbed(target, tree="chain")
    heads = drafter.heads
    ids = torch.tensor([PROMPT + [2, 7, 9, 11]])
    features = target_features(target.model, ids)
    logits = heads(features, ids)
    t = 2
    for k in range(4):
        x = torch.cat([features[0, t], heads.embed(ids[0, t + 1 : t + 2 + k]).reshape(-1)])
        assert torch.allclose(logits[k][0, t], heads.head_logits(k, x), atol=1e-5)
    loss, per_head = hydra_loss(heads, features, ids)
    assert len(per_head) == 4 and loss.item() > 0
    table = hydra_rank_table(heads, features, ids, ranks=5)
    assert table.shape == (ids.shape[1] - 5, 4) and rank_accuracies(table, 5).shape == (4, 5)


def test_first_pass_is_an_empty_draft_and_observe_needs_features(target):
    drafter = HydraDrafter(target, weights="random", tree=TREE)
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=1)
    assert result.metrics.target_passes == 1
    with pytest.raises(RuntimeError, match="needs the target's features"):
        drafter.observe(VerifyOutcome([1], [], 0, None))


@pytest.mark.parametrize("tree", ["chain", TREE])
def test_greedy_equals_plain_decoding_with_perturbed_heads(target, tree):
    drafter = _perturbed(target, tree=tree, policy="constant")
    for prompt in (PROMPT, [7, 7, 7, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]):
        result = sf.generate(target, drafter, prompt, max_new_tokens=30)
        assert result.tokens == _plain(target, prompt, 30)
        assert result.metrics.draft_steps > 0  # it drafted: the equality was tested on verified trees


def test_lossless_tree_sampling():
    # as Medusa's: its tree reaches depth 3 rarely on the tiny target, depth 2 held to power 0.9
    assert_lossless(lambda t: _perturbed(t, scale=0.1, tree=TREE), configs=SAMPLING_MATRIX[:1], min_depth=2)


def test_bad_options_are_refused(target):
    with pytest.raises(ValueError, match="gamma \\(tree depth\\) 5 exceeds the number of Hydra heads \\(4\\)"):
        HydraDrafter(target, weights="random", gamma=5)
    with pytest.raises(ValueError, match="tree must be None, 'chain' or a list of rank paths"):
        HydraDrafter(target, weights="random", tree="wide")
    assert make_policy("constant", 2) is not None and "hydra" in sf.list_drafters()


def test_slim_heads_have_one_grounding_matrix_each_and_a_shared_prefix_projection():
    """Head k's first block is one H x (H + (k + 1) r) matrix over the feature and the projected prefix; the
    recipe's shape for zoo:smollm2 (H 576, K 4, 2 blocks, r 256, shared head) is under 10 MB at fp16."""
    h, r, v = 576, 256, 49152
    with torch.device("meta"):
        shape = HydraShape(4, h, v, layers=2, share_lm_head=True, prefix_rank=r)
        heads = HydraHeads(shape, torch.nn.Embedding(v, h), torch.nn.Linear(h, v, bias=False))
    assert tuple(heads.prefix.weight.shape) == (r, h)
    assert [tuple(head.blocks[0].linear.weight.shape) for head in heads.heads] == [(h, h + (k + 1) * r)
                                                                                   for k in range(4)]
    count = sum(p.numel() for p in heads.parameters())
    assert count == sum((h + (k + 1) * r) * h + h for k in range(4)) + 4 * (h * h + h) + r * h
    assert 2 * count < 10_000_000  # fp16 bytes; the draft vocabulary's ids add 16384 x 8


def test_prefix_rank_is_a_shape_option_and_an_old_layout_checkpoint_is_refused(target, tmp_path):
    drafter = HydraDrafter(target, weights="random", prefix_rank=8)
    assert drafter.heads.shape.prefix_rank == 8 and tuple(drafter.heads.prefix.weight.shape) == (8, 32)
    meta = MedusaCheckpoint(drafter.heads.shape, target_identity(target.model), [[0], [0, 0]])
    save_hydra(tmp_path / "heads", drafter.heads, meta)
    loaded = HydraDrafter(target, weights=str(tmp_path / "heads"))
    assert loaded.heads.shape.prefix_rank == 8 and list(loaded.tree.paths) == [(0,), (0, 0)]
    with pytest.raises(ValueError, match="prefix_rank=16 conflicts with the checkpoint's prefix_rank=8"):
        HydraDrafter(target, weights=str(tmp_path / "heads"), prefix_rank=16)
    with pytest.raises(ValueError, match="prefix_rank must be an integer >= 1, got 0"):
        HydraDrafter(target, weights="random", prefix_rank=0)
    config = tmp_path / "heads" / "config.json"
    config.write_text(config.read_text().replace('"version": 2', '"version": 1'))
    with pytest.raises(ValueError, match="has checkpoint version 1; this code reads 2"):
        HydraDrafter(target, weights=str(tmp_path / "heads"))


def _turns(heldout: bool, count: int) -> list[str]:
    turns = (f"user turn {i}" for i in range(100000))
    return [turn for turn, _ in zip((t for t in turns if is_heldout(t) == heldout), range(count), strict=False)]


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, target):
    """Two batch files of conversations: a random prompt, then the target's greedy answer, with real features."""
    folder = tmp_path_factory.mktemp("distilled")
    gen = torch.Generator().manual_seed(0)
    turns = _turns(False, 10) + _turns(True, 3)
    for index, batch_turns in enumerate((turns[:6], turns[6:])):
        prompts, convs = [], []
        for _ in batch_turns:
            prompt = torch.randint(0, V, (1, int(torch.randint(4, 9, (1,), generator=gen))), generator=gen)
            with torch.no_grad():
                out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                            max_new_tokens=40, min_new_tokens=40, pad_token_id=0)
            prompts.append(prompt[0].tolist())
            convs.append((out[0].tolist(), target_features(target.model, out)[0, :-1]))
        write_batch(DistillConfig(out=str(folder)), index, batch_turns, prompts, convs)
    return folder


def test_training_on_distilled_data_exports_a_hydra_checkpoint_and_resumes(distilled, target, tmp_path):
    cfg = TrainConfig(target="tiny", distilled=str(distilled), out=str(tmp_path / "run"), num_heads=3, steps=4,
                      batch=4, seq_len=32, lr=3e-3, warmup=1, eval_every=2, eval_windows=4, eval_prompts=2,
                      eval_tokens=16, ranks=4, max_nodes=8, draft_vocab=12)
    state = train(cfg, target=target)
    assert state.step == 4 and [row["step"] for row in state.history] == [2, 4]
    folder = tmp_path / "run" / "heads"
    meta = read_hydra(folder)
    assert meta.shape.draft_vocab == 12 and meta.shape.num_heads == 3 and meta.calibration["tau"] == state.best_tau
    drafter = sf.create_drafter("hydra", target, weights=str(folder))
    assert sorted(drafter.tree.paths) == sorted(tuple(p) for p in meta.tree)
    prompt = load_distilled(distilled)[1].prompt(0)
    assert sf.generate(target, drafter, prompt, max_new_tokens=24).tokens == _plain(target, prompt, 24)
    with pytest.raises(ValueError, match="is not a Medusa checkpoint \\(format 'specfamily-hydra'"):
        sf.create_drafter("medusa", target, weights=str(folder))
    resumed = train(replace(cfg, steps=6), target=target)
    assert resumed.step == 6 and [row["step"] for row in resumed.history] == [2, 4, 6]


def test_a_warm_start_from_medusa_heads_proposes_what_they_propose(target):
    from specfamily.drafters.medusa.hydra_heads import hydra_from_medusa

    medusa = MedusaDrafter(target, weights="random", tree=TREE, layers=2, policy="constant")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in medusa.heads.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    hydra = HydraDrafter.from_heads(target, hydra_from_medusa(target, medusa.heads).eval(), tree=TREE,
                                    policy="constant")
    features = target_features(target.model, torch.tensor([PROMPT]))[0]
    top = medusa.heads(features[-2], 4).topk(medusa.tree.top_k, dim=-1).indices.reshape(-1)
    assert hydra.draft_tokens(features[-2], PROMPT[-1], 4).tolist() == top[medusa.tree.gather].tolist()
    assert [len(h.blocks) for h in hydra.heads.heads] == [2, 2, 2, 2]


def test_a_drafter_drafts_one_full_tree_at_load(target, monkeypatch):
    """Its heads' first tree costs ~60 ms more than the next on SmolLM2 (docs/batching-log.md, session 32): paid at
    load, not by the first drafted pass, which the length policy would count as that pass's cost."""
    depths = []
    draft_tokens = HydraDrafter.draft_tokens
    monkeypatch.setattr(HydraDrafter, "draft_tokens",
                        lambda self, f, r, d: depths.append(d) or draft_tokens(self, f, r, d))
    drafter = sf.create_drafter("hydra", target, weights="random")
    assert depths == [drafter.tree.depth]


def test_a_hydra_draft_on_an_accelerator_keeps_its_parents_on_the_host():
    """On a stand-in target (an accelerator's path): the tree's parents stay on the host, as the verifier reads them
    (on the device, the Draft checks, is_chain and verified_depth read them back, four waits a request a pass); a
    decoding under the counter reads no value back from a draft's parents."""
    from pathlib import Path

    from specfamily.core.target import load_target
    from specfamily.testing import tiny_model
    from specfamily.testing.syncs import SyncCounter, stand_in_module

    with SyncCounter() as syncs:
        model = stand_in_module(tiny_model("llama", 64, 0, torch.float32, spread=1.0))
        target = load_target(model)
        drafter = sf.create_drafter("hydra", target, weights="random", gamma=3)
        result = sf.generate(target, drafter, [3, 17, 9, 40, 2], 12)
    assert drafter.parents.device.type == "cpu" and result.metrics.proposed_tokens > 0
    assert not [s for s in syncs.syncs if s.kind == "read" and Path(s.where.rsplit(":", 1)[0]).name == "types.py"]
