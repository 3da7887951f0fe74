"""The merge drafter through the public API: registration, options, what each part observes, greedy identity, and
losslessness of merged trees whose parts report sampled q (the conditioning on earlier siblings is what is tested)."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.plugins import get_registry
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.merge.config import MergeConfig
from specfamily.drafters.merge.drafter import MergeDrafter, feature_plan
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, draft_model_for, tiny_target

LOOKUP_PROMPT = (1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3)  # prompt lookup / suffix have something to copy from the start


def _merge(target, parts=("prompt_lookup", "eagle3"), **options):
    part_options = {"eagle3": {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 12},
                    "prompt_lookup": {"gamma": 3, "branches": 2}, "suffix": {"gamma": 3}}
    if "small_model" in parts:
        part_options["small_model"] = {"model": draft_model_for(target), "gamma": 3}
    part_options.update(options.pop("options", {}))
    chosen = {name: part_options[name] for name in parts if name in part_options}
    return sf.create_drafter("merge", target, parts=list(parts), options=chosen, **options)


class Recorder:
    """Forwards the protocol to a drafter and keeps what it proposed and observed."""

    def __init__(self, inner) -> None:
        self.inner, self.drafts, self.outcomes = inner, [], []
        self.needs_features, self.lossy, self.policy = inner.needs_features, inner.lossy, inner.policy
        self.default_gamma = inner.default_gamma

    def begin(self, ctx) -> None:
        self.inner.begin(ctx)

    def propose(self, ctx, gamma):
        draft = self.inner.propose(ctx, gamma)
        self.drafts.append(draft)
        return draft

    def observe(self, outcome: VerifyOutcome) -> None:
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


# --- registration and options ---------------------------------------------------------------------


def test_registered_with_its_config_and_defaults():
    assert "merge" in sf.list_drafters() and get_registry().entry("merge").config is MergeConfig
    target = tiny_target("llama")
    drafter = _merge(target)
    assert isinstance(drafter, MergeDrafter) and drafter.names == ["prompt_lookup", "eagle3"]
    assert drafter.caps == [3, 3] and drafter.default_gamma == 3
    assert drafter.needs_features == drafter.parts[1].needs_features  # eagle3's layers, asked for by the merge
    assert MergeConfig().parts == ["suffix", "eagle3"]


@pytest.mark.parametrize(("options", "message"), [
    ({"parts": []}, "merge parts must be a non-empty list of drafter names, got []"),
    ({"parts": "suffix"}, "merge parts must be a non-empty list of drafter names, got 'suffix'"),
    ({"parts": ["suffix", "merge"]}, "merge parts cannot include merge itself"),
    ({"parts": ["suffix", "suffix"]}, "merge parts name a drafter twice: ['suffix', 'suffix']"),
    ({"parts": ["suffix"], "options": {"eagle3": {}}},
     "merge options name ['eagle3'], which are not among the parts ['suffix']"),
    ({"parts": ["sufix"]}, "unknown drafter 'sufix'; did you mean 'suffix'?"),
    ({"gamma": 0}, "merge gamma must be an integer >= 1, got 0"),
    ({"min_tokens": 0}, "merge min_tokens must be an integer >= 1 or null, got 0"),
])
def test_bad_options_are_refused_before_any_model_loads(options, message):
    with pytest.raises(ValueError) as info:
        get_registry().validate("merge", **options)
    assert str(info.value).startswith(message)


def test_a_part_s_options_are_checked_against_its_own_schema():
    with pytest.raises(TypeError, match="drafter 'suffix' got unknown option 'depth'"):
        get_registry().validate("merge", parts=["suffix"], options={"suffix": {"depth": 3}})


def test_lossy_parts_and_mixed_feature_kinds_are_refused():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match="merge cannot take the lossy drafter 'medusa'"):
        sf.create_drafter("merge", target, parts=["medusa"], options={"medusa": {"weights": "random", "typical": True}})
    with pytest.raises(ValueError, match=r"\['eagle'\] need the last normed state, \['eagle3'\] need layer features"):
        sf.create_drafter("merge", target, parts=["eagle", "eagle3"],
                          options={"eagle": {"weights": "random"}, "eagle3": {"weights": "random"}})


def test_one_feature_request_serves_parts_asking_for_different_layers():
    plan = feature_plan([(0, 2), False, (2, 1)], ["a", "b", "c"])
    assert plan.needs == (0, 2, 1) and plan.picks == ((0, 1), None, (1, 2))
    features = torch.arange(2 * 6).view(2, 6)  # 3 layers of width 2
    assert plan.part_features(0, features).tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert plan.part_features(1, features) is None
    assert plan.part_features(2, features).tolist() == [[2, 3, 4, 5], [8, 9, 10, 11]]
    same = feature_plan([True, True], ["a", "b"])
    assert same.needs is True and same.part_features(1, features) is features


# --- what each part proposes and observes ---------------------------------------------------------


def test_each_part_observes_its_own_accepted_path_and_features():
    target = tiny_target("llama")
    parts = [Recorder(sf.create_drafter("prompt_lookup", target, gamma=3, branches=2)),
             Recorder(sf.create_drafter("eagle3", target, weights="random", gamma=3, top_k=4, total_tokens=12))]
    merge = MergeDrafter(target, parts=parts, gamma=3)  # constant: every pass proposes
    result = sf.generate(target, merge, list(LOOKUP_PROMPT), max_new_tokens=24)
    assert result.tokens == sf.generate(target, None, list(LOOKUP_PROMPT), max_new_tokens=24).tokens
    lookup, eagle = parts
    assert len(lookup.outcomes) == len(eagle.outcomes) > 0
    both = 0
    for k, part in enumerate(parts):
        for draft, outcome in zip(part.drafts, part.outcomes, strict=False):
            assert outcome.draft_size == len(draft)
            path = outcome.accepted_nodes
            parents = draft.parents.tolist()
            assert all(parents[node] == (path[i - 1] if i else -1) for i, node in enumerate(path))
            assert draft.tokens[path].tolist() == outcome.tokens[: len(path)]  # its own tokens, committed
            both += k == 1 and len(path) > 0
    assert both > 0  # eagle3's own nodes were accepted, not only prompt lookup's
    assert all(o.features is not None and o.features.shape[-1] == 3 * target.model.config.hidden_size
               for o in eagle.outcomes)
    assert all(o.features is None for o in lookup.outcomes)


def test_with_min_tokens_a_later_part_drafts_only_where_the_earlier_found_nothing():
    target = tiny_target("llama")
    parts = [Recorder(sf.create_drafter("prompt_lookup", target, gamma=3)),
             Recorder(sf.create_drafter("eagle3", target, weights="random", gamma=3, top_k=4, total_tokens=12))]
    merge = MergeDrafter(target, parts=parts, gamma=3, min_tokens=1)
    prompt = [1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3, 7, 4]
    result = sf.generate(target, merge, prompt, max_new_tokens=24)
    assert result.tokens == sf.generate(target, None, prompt, max_new_tokens=24).tokens
    lookup, eagle = parts
    asked = [len(draft) == 0 for draft in lookup.drafts]  # eagle3 is asked exactly on these passes
    assert len(eagle.drafts) == sum(asked) and 0 < sum(asked) < len(asked)
    assert len(eagle.outcomes) == len(lookup.outcomes)  # it observes every pass, drafted for or not
    assert all(o.features is not None for o in eagle.outcomes)


# --- greedy identity and losslessness -------------------------------------------------------------


@pytest.mark.parametrize(("parts", "depth"), [(("prompt_lookup", "eagle3"), 3), (("small_model", "eagle"), 2)],
                         ids=["prompt_lookup+eagle3", "small_model+eagle"])
def test_greedy_identical_to_plain_decoding(parts, depth):
    """Trees verified ``depth`` deep (random eagle heads and a random draft model are rarely accepted twice)."""
    options = {"options": {"eagle": {"weights": "random", "gamma": 3}}} if "eagle" in parts else {}
    reports = assert_greedy_equivalent(lambda target: _merge(target, parts, **options))
    assert all(report.depth.trees > 0 for report in reports)
    assert max(len(report.depth.verified) for report in reports) >= depth, [r.depth for r in reports]


SAMPLED = {"options": {"eagle3": {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 30,
                                  "tree_sampling": "sampled"}}}


@pytest.mark.parametrize("sampling", [pytest.param(s, marks=[] if i == 1 else [pytest.mark.slow])
                                      for i, s in enumerate(SAMPLING_MATRIX)],
                         ids=["t1", "t07-top_p09", "top_k5"])  # t0.7/top-p by default, the rest in the slow suite
def test_lossless_when_every_part_reports_a_sampled_q(sampling):
    """eagle3's sampled tree, then small_model's sampled chain under it: every node small_model adds beside
    eagle3's children reports its q given theirs."""
    [fit] = assert_lossless(lambda target: _merge(target, ("eagle3", "small_model"), **SAMPLED), configs=[sampling],
                            min_depth=2)
    depth = fit.depth
    assert depth.deepest_verified == depth.deepest_drafted == 3 and depth.trees > 0, depth.summary()
    print(f"\n{fit.describe()}")


def test_lossless_with_the_default_parts():
    """suffix then eagle3 (top-k tree): deterministic nodes only (q None), trees verified 2 deep on the lookup
    prompt."""
    [fit] = assert_lossless(lambda target: _merge(target, ("suffix", "eagle3")), configs=[SAMPLING_MATRIX[0]],
                            prompt=LOOKUP_PROMPT, min_depth=1)
    assert fit.depth.deepest_verified >= 2 and fit.depth.trees > 0, fit.depth.summary()


def test_lossless_with_min_tokens():
    """small_model's sampled chain first (stopping after a token its q doubts), eagle3's sampled tree added only
    on passes where the chain stopped after one token (min_tokens 2): which passes get a tree depends on the
    chain alone."""
    options = {"options": {**SAMPLED["options"], "small_model": {"gamma": 3, "confidence": 0.3}}}

    def factory(target):
        options["options"]["small_model"]["model"] = draft_model_for(target)
        return _merge(target, ("small_model", "eagle3"), min_tokens=2, **options)

    [fit] = assert_lossless(factory, configs=[SAMPLING_MATRIX[0]], min_depth=1)
    assert fit.depth.deepest_verified == 3 and 0 < fit.depth.trees < fit.depth.passes, fit.depth.summary()
