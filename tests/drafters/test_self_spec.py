import json
import warnings

import pytest
import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import specfamily as sf
from specfamily.core.context import DecodeContext
from specfamily.drafters.self_spec.config import SelfSpecConfig, SkipSetRecord, model_key, save_skip_set
from specfamily.drafters.self_spec.drafter import ExitThreshold, SelfSpecDrafter
from specfamily.drafters.self_spec.layers import LayerRunner, causal_mask, format_skip, parse_skip
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, tiny_model, tiny_target


def _drafter(skip=("mlp:1",), gamma=3, **options):
    return lambda target: SelfSpecDrafter(target, skip=list(skip), gamma=gamma, **options)


def test_greedy_equals_transformers():
    assert_greedy_equivalent(_drafter(["mlp:1"], gamma=3))


def test_greedy_equals_transformers_with_adaptive_exit_and_skipped_attention():
    assert_greedy_equivalent(_drafter(["attn:0"], gamma=5, adaptive_exit=True, exit_threshold=0.3))


def test_lossless_sampling_with_adaptive_exit(monkeypatch):
    """One sampling config in the default suite; adaptive exit cuts some drafts and not others.

    The kit's tiny target is near-uniform (the draft's top-1 probability lies in 0.16-0.27 at temperature 1), and
    the first draft step after the kit's prompt has top-1 probability 0.170-0.172: a threshold of 0.17 lets it
    through and cuts the drafts whose later steps are less confident (about one in ten)."""
    cuts: list[tuple[int, bool]] = []  # (gamma asked, cut by the threshold) of every proposal
    propose = SelfSpecDrafter.propose

    def recorded(self, ctx, gamma):
        draft = propose(self, ctx, gamma)
        cuts.append((gamma, self._cut))
        return draft

    monkeypatch.setattr(SelfSpecDrafter, "propose", recorded)
    assert_lossless(_drafter(["mlp:1"], gamma=3, adaptive_exit=True, exit_threshold=0.17), configs=SAMPLING_MATRIX[:1])
    cut = sum(was_cut for _, was_cut in cuts)
    full = sum(gamma == 3 and not was_cut for gamma, was_cut in cuts)
    assert cut >= 50 and full >= 500, f"{cut} drafts cut by the exit, {full} of full length 3, of {len(cuts)}"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("adaptive_exit", [False, True])
def test_lossless_full_matrix(family, adaptive_exit):
    assert_lossless(_drafter(["attn:1"], gamma=2, adaptive_exit=adaptive_exit, exit_threshold=0.4), family=family,
                    min_depth=1 if adaptive_exit else 3)


def _start(target, prompt, sampling=None):
    ids = target.check_ids(prompt)
    ctx = DecodeContext(target, ids, sampling or sf.SamplingConfig(), torch.Generator().manual_seed(0), ids.tolist())
    target.reset()
    return ctx


def _snapshot(cache):
    return [(layer.keys, layer.values, layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@torch.inference_mode()
def test_propose_leaves_the_target_cache_exactly_as_committed(family):
    target = tiny_target(family, vocab_size=64, spread=1.0)
    drafter = SelfSpecDrafter(target, skip=["mlp:0", "attn:1"], gamma=4)
    ctx = _start(target, [5, 6, 7, 8, 9])
    draft = drafter.propose(ctx, 4)  # first pass: the whole prompt is pending, the cache is empty
    assert len(draft) == 4
    assert all(layer.keys is None for layer in target.cache.layers)
    out = target.forward(ctx.prompt_ids, draft)
    target.commit([0, 1])
    ctx.tokens += draft.tokens[:2].tolist() + [int(out.logits[2].argmax())]
    for _ in range(3):
        before = _snapshot(target.cache)
        drafter.propose(ctx, 4)
        for layer, (keys, values, keys_copy, values_copy) in zip(target.cache.layers, before, strict=True):
            assert layer.keys is keys and layer.values is values
            assert layer.keys.shape[-2] == target.cached_length == len(ctx.tokens) - 1
            assert torch.equal(layer.keys, keys_copy) and torch.equal(layer.values, values_copy)
        pending = torch.tensor(ctx.tokens[target.cached_length :])
        out = target.forward(pending)
        target.commit([])
        ctx.tokens.append(int(out.logits[0].argmax()))


@torch.inference_mode()
def test_a_failing_draft_pass_still_restores_the_cache(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = SelfSpecDrafter(target, skip=["mlp:1"], gamma=4)
    ctx = _start(target, [5, 6, 7, 8, 9])
    target.forward(ctx.prompt_ids[:-1])
    target.commit([])
    before = _snapshot(target.cache)
    calls = []

    head = target.lean.head  # the draft runs through the target's lean forward (asserted below)

    def failing_logits(hidden):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return head(hidden)

    monkeypatch.setattr(target.lean, "head", failing_logits)
    with pytest.raises(RuntimeError, match="out of memory"):
        drafter.propose(ctx, 4)
    for layer, (keys, values, _, _) in zip(target.cache.layers, before, strict=True):
        assert layer.keys is keys and layer.values is values and keys.shape[-2] == 4


@torch.inference_mode()
def test_lean_skipping_equals_the_runner_and_drafts_through_the_targets_products(monkeypatch):
    """The draft runs the target's lean forward with the skip set (its products, the stream kernel's where the
    target uses it): the same hidden states as the model's own sub-modules, and the runner only without it."""
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = SelfSpecDrafter(target, skip=["attn:0", "mlp:1"], gamma=3)
    assert drafter.kept == ((False, True), (True, False))
    ids, positions = torch.tensor([[4, 8, 15, 16, 23]]), torch.arange(5).view(1, -1)
    mask = causal_mask(0, 5, drafter.runner.dtype, "cpu")
    lean = target.lean.skipping(ids, positions, mask, None, drafter.kept)
    assert torch.allclose(lean, drafter.runner.hidden(ids, positions, mask, None, drafter.plan), atol=1e-6, rtol=0)
    assert not torch.allclose(lean, drafter.runner.hidden(ids, positions, mask, None, drafter.runner.plan(
        frozenset())), atol=1e-3)  # the skips are applied
    runner_calls = []
    monkeypatch.setattr(drafter.runner, "hidden", lambda *a, **k: runner_calls.append(1) or LayerRunner.hidden(
        drafter.runner, *a, **k))
    plain = sf.generate(target, None, [5, 6, 7, 8, 9], max_new_tokens=16).tokens
    result = sf.generate(target, drafter, [5, 6, 7, 8, 9], max_new_tokens=16)
    assert result.tokens == plain and result.metrics.draft_steps > 0 and not runner_calls
    monkeypatch.setattr(target, "lean", None)  # a target without the lean forward: the model's sub-modules
    result = sf.generate(target, drafter, [5, 6, 7, 8, 9], max_new_tokens=16)
    assert result.tokens == plain and result.metrics.draft_steps > 0 and runner_calls


@torch.inference_mode()
def test_draft_equals_the_model_without_the_skipped_layer():
    """Skipping the last layer drafts what the model truncated to its first layer would (layer 0's keys agree)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    truncated = tiny_model("llama", 64, spread=1.0)
    truncated.model.layers = truncated.model.layers[:1]
    drafter = SelfSpecDrafter(target, skip=["layer:1"], gamma=6)
    prompt = [3, 1, 4, 1, 5]
    ctx = _start(target, prompt)
    ids = torch.tensor([prompt])
    expected = truncated.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                                  min_new_tokens=6, pad_token_id=0)[0, 5:]
    assert drafter.propose(ctx, 6).tokens.tolist() == expected.tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@torch.inference_mode()
def test_runner_without_skips_reproduces_the_model(family):
    target = tiny_target(family, vocab_size=64, spread=1.0)
    runner = LayerRunner(target.model)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    positions = torch.arange(6).view(1, -1)
    from specfamily.drafters.self_spec.layers import causal_mask

    mask = causal_mask(0, 6, runner.dtype, "cpu")
    ours = runner.logits(runner.hidden(ids, positions, mask, None, runner.plan(frozenset())))
    torch.testing.assert_close(ours, target.model(input_ids=ids).logits, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("config_class", "model_class", "extra"),
    [(Qwen2Config, Qwen2ForCausalLM, {}), (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 8}),
     (MistralConfig, MistralForCausalLM, {"sliding_window": None})],
    ids=["qwen2", "qwen3", "mistral"],
)
def test_other_llama_family_models_draft_and_stay_greedy_exact(config_class, model_class, extra):
    """Grouped-query attention included (4 query heads over 2 key/value heads)."""
    config = config_class(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    model = model_class(config).to(torch.float64).eval()
    model.config._attn_implementation = "sdpa"
    target = sf.load_target(model)
    drafter = SelfSpecDrafter(target, skip=["mlp:1"], gamma=3)  # builds the runner, which checks itself
    plain = sf.generate(target, None, [1, 2, 3], max_new_tokens=20)
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=20)
    assert result.tokens == plain.tokens
    assert result.metrics.acceptance_rate > 0


def test_skipping_nothing_accepts_every_token():
    target = tiny_target("gpt2", vocab_size=64, spread=1.0)
    result = sf.generate(target, SelfSpecDrafter(target, skip=[], gamma=4), [1, 2, 3], max_new_tokens=30)
    assert result.metrics.acceptance_rate == 1.0
    assert result.metrics.mean_accepted_length == 5.0


def test_sampled_drafts_report_their_warped_q():
    target = tiny_target("llama", vocab_size=16)
    sampling = sf.SamplingConfig(temperature=0.7, top_k=5)
    ctx = _start(target, [1, 2, 3], sampling)
    draft = SelfSpecDrafter(target, skip=["mlp:1"], gamma=3).propose(ctx, 3)
    assert draft.q.shape == (3, 16)
    torch.testing.assert_close(draft.q.sum(-1), torch.ones(3), rtol=0, atol=1e-6)
    assert bool((draft.q > 0).sum(-1).le(5).all())  # top-k 5 applied to q as to p
    assert bool((draft.q[torch.arange(3), draft.tokens] > 0).all())


def test_adaptive_exit_cuts_drafts_at_the_threshold():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    prompt = [1, 2, 3]
    always = SelfSpecDrafter(target, skip=["mlp:1"], gamma=4, adaptive_exit=True, exit_threshold=1.0)
    result = sf.generate(target, always, prompt, max_new_tokens=20)
    assert result.metrics.proposed_tokens == result.metrics.target_passes  # one token per draft
    never = SelfSpecDrafter(target, skip=["mlp:1"], gamma=4, adaptive_exit=True, exit_threshold=0.0)
    result = sf.generate(target, never, prompt, max_new_tokens=21)
    assert result.metrics.proposed_tokens > result.metrics.target_passes


def test_exit_threshold_follows_draft_and_verify():
    exit = ExitThreshold(initial=0.5, target=0.9, step=0.01, beta1=0.5, beta2=0.9)
    exit.update(drafted=4, accepted=1, cut=True)  # AR = 0.125 <= 0.9: raise
    assert exit.acceptance == pytest.approx(0.125)
    assert exit.threshold == pytest.approx(0.9 * 0.5 + 0.1 * 0.51)
    exit.update(drafted=4, accepted=4, cut=False)  # a full-length draft moves AR only
    assert exit.acceptance == pytest.approx(0.5625)
    assert exit.threshold == pytest.approx(0.501)
    exit.acceptance = 1.0
    exit.update(drafted=2, accepted=2, cut=True)  # AR = 1 > 0.9: lower
    assert exit.threshold == pytest.approx(0.9 * 0.501 + 0.1 * 0.491)
    exit.reset()
    assert (exit.threshold, exit.acceptance) == (0.5, 0.0)


def test_skip_entries_parse_and_format():
    skipped = parse_skip(["attn:0", "layer:2", "mlp:1 "], 3)
    assert skipped == {("attn", 0), ("attn", 2), ("mlp", 2), ("mlp", 1)}
    assert format_skip(skipped) == ["attn:0", "mlp:1", "layer:2"]
    with pytest.raises(ValueError, match=r"skip entry 'ffn:1' is not of the form 'attn:i', 'mlp:i' or 'layer:i'"):
        parse_skip(["ffn:1"], 3)
    with pytest.raises(ValueError, match=r"skip entry 'mlp:3': layer 3 does not exist \(the model has 3 layers\)"):
        parse_skip(["mlp:3"], 3)


def test_skip_option_forms():
    target = tiny_target("llama", vocab_size=16)
    assert SelfSpecDrafter(target, skip="attn:0, mlp:1").skipped == {("attn", 0), ("mlp", 1)}
    with pytest.raises(TypeError, match="skip must be a skip-set file, a zoo: name or a list"):
        SelfSpecDrafter(target, skip=3)
    with pytest.raises(ValueError, match="no shipped skip set 'zoo:nope'"):
        SelfSpecDrafter(target, skip="zoo:nope")
    with pytest.raises(ValueError, match="skip-set file '/no/such.json' does not exist"):
        SelfSpecDrafter(target, skip="/no/such.json")
    with pytest.raises(ValueError, match=r"there are no skip_set weights for this target in the zoo.*pass skip=.*"
                                         r"`python -m specfamily\.drafters\.self_spec\.search --model "):
        SelfSpecDrafter(target)


def _record(model, skip, name="tiny"):
    return SkipSetRecord(model_key(model, name), skip, gamma=3, alpha=0.8, c=0.5, verify_cost=1.1,
                         predicted_speedup=1.4)


def test_skip_file_is_checked_against_the_target(tmp_path):
    target = tiny_target("llama", vocab_size=16)
    path = save_skip_set(tmp_path / "s.json", _record(target.model, ["layer:1"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SelfSpecDrafter(target, skip=str(path)).skipped == {("attn", 1), ("mlp", 1)}
    retrained = tiny_target("llama", vocab_size=16, seed=9)
    with pytest.warns(UserWarning, match="searched on other weights of this architecture"):
        SelfSpecDrafter(retrained, skip=path)
    other = tiny_target("llama", vocab_size=16, layers=3)
    with pytest.raises(ValueError, match=r"was searched for 'tiny' \(llama, 2 layers"):
        SelfSpecDrafter(other, skip=path)


def test_default_skip_set_is_the_zoo_one_for_this_target(tmp_path, monkeypatch):
    import specfamily.drafters.self_spec.drafter as drafter_module
    import specfamily.zoo as zoo

    target = tiny_target("llama", vocab_size=16)
    other = save_skip_set(tmp_path / "other.json", _record(tiny_target("gpt2", vocab_size=16).model, ["mlp:0"]))
    mine = save_skip_set(tmp_path / "mine.json", _record(target.model, ["attn:1"]))
    monkeypatch.setattr(drafter_module, "shipped_skip_sets", lambda: {"other": other, "mine": mine})
    asked = []
    monkeypatch.setattr(zoo, "default_weights", lambda kind, t: asked.append((kind, t)) or "zoo:code-skip")
    monkeypatch.setattr(zoo, "zoo_path", lambda name: {"zoo:code-skip": mine}[name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SelfSpecDrafter(target).skipped == {("attn", 1)}  # the catalogue's entry for this target
        assert asked == [("skip_set", target)]
        assert SelfSpecDrafter(target, skip="zoo:mine").skip_source == str(mine)
    with pytest.raises(ValueError, match=r"was searched for 'tiny' \(gpt2, 2 layers"):
        SelfSpecDrafter(target, skip="zoo:other")


def test_shipped_zoo_skip_set_fits_the_shipped_zoo_target():
    from specfamily.drafters.self_spec.config import shipped_skip_sets
    from specfamily.zoo import zoo_path

    try:
        zoo_path("zoo:code-target")
    except FileNotFoundError:
        pytest.skip("zoo:code-target is not shipped yet")
    if "code-target" not in shipped_skip_sets():
        pytest.skip("skip_sets/code-target.json is not shipped yet")
    target = sf.load_target("zoo:code-target", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # searched on exactly these weights
        drafter = sf.create_drafter("self_spec", target)
    assert drafter.skip_source == str(shipped_skip_sets()["code-target"])
    from specfamily.drafters.self_spec.config import load_skip_set

    searched = load_skip_set(shipped_skip_sets()["code-target"]).gamma
    assert drafter.policy.next_gamma() == searched  # the gamma the set was searched at, unless given
    assert sf.create_drafter("self_spec", target, gamma=searched + 2).policy.next_gamma() == searched + 2
    by_catalogue_name = sf.create_drafter("self_spec", target, skip="zoo:code-skip")
    assert by_catalogue_name.skip_source == str(shipped_skip_sets()["code-target"])


def test_skip_file_writes_are_atomic(tmp_path):
    target = tiny_target("llama", vocab_size=16)
    path = save_skip_set(tmp_path / "s.json", _record(target.model, ["mlp:1"]))
    before = path.read_text()
    bad = _record(target.model, ["mlp:0"])
    bad.search = {"not json": object()}
    with pytest.raises(TypeError):
        save_skip_set(path, bad)
    assert path.read_text() == before and json.loads(before)["skip"] == ["mlp:1"]
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    path.write_text("{}")
    with pytest.raises(ValueError, match="is not a self_spec skip-set file"):
        SelfSpecDrafter(target, skip=path)


def test_unsupported_family_is_refused():
    config = GPTNeoXConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=64)
    model = GPTNeoXForCausalLM(config).eval()
    with pytest.raises(ValueError, match=r"self_spec cannot skip layers of GPTNeoXForCausalLM \(model_type "
                                         r"'gpt_neox'\); supported model types: llama, mistral, qwen2, qwen3, gpt2"):
        LayerRunner(model)


def test_a_block_the_runner_does_not_reproduce_is_refused():
    model = tiny_model("llama", 16)
    layer = model.model.layers[0]
    plain_forward = layer.forward
    layer.forward = lambda *args, **kwargs: plain_forward(*args, **kwargs) + 1.0  # a block that is not pre-norm
    with pytest.raises(ValueError, match="layer runner does not reproduce LlamaForCausalLM's forward"):
        LayerRunner(model)


def test_options_are_validated():
    target = tiny_target("llama", vocab_size=16)
    with pytest.raises(TypeError, match="unknown option 'adaptive'; did you mean 'adaptive_exit'"):
        sf.create_drafter("self_spec", target, skip=["mlp:1"], adaptive=True)
    with pytest.raises(ValueError, match=r"exit_threshold must be a number in \[0, 1\], got 1.5"):
        SelfSpecConfig(exit_threshold=1.5)
    with pytest.raises(ValueError, match="gamma"):
        sf.create_drafter("self_spec", target, skip=["mlp:1"], gamma=0)
    assert "self_spec" in sf.list_drafters()
