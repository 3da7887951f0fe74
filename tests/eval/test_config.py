"""Config composition (Hydra's compose API over the shipped configs) and drafter option validation."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import specfamily as sf
from specfamily.core.plugins import get_registry
from specfamily.eval.config import (
    PLAIN,
    ConfigError,
    check_config,
    configs_dir,
    drafter_specs,
    sampling_config,
    sampling_label,
    validate_specs,
)
from specfamily.eval.datasets import DatasetSpec
from specfamily.eval.searchpath import compose


def _options(specs, label):
    return next(spec.options for spec in specs if spec.label == label)


def test_default_config_is_the_default_comparison(compose_config):
    cfg = compose_config([])
    specs = drafter_specs(cfg)
    assert [spec.label for spec in specs] == [PLAIN, *sf.list_drafters()]
    assert specs[0].name is None and specs[0].options == {}
    assert cfg.model.target == "zoo:smollm2"
    small_model = {"model": None, "gamma": None, "policy": None, "dtype": None, "confidence": 0.0, "quantize": 0}
    assert _options(specs, "small_model") == small_model  # model None: the zoo's draft for the target, if any
    assert sampling_config(cfg.sampling) == sf.SamplingConfig(0.0, 0, 1.0)
    dataset = DatasetSpec.from_config(cfg.dataset)
    assert (dataset.path, dataset.select, dataset.num_examples, dataset.max_new_tokens) == (
        "specfamily:spec_bench", "per_category", 1, 128)
    validate_specs(specs)


def test_model_zoo_is_the_code_family(compose_config):
    cfg = compose_config(["model=zoo", "dataset=complete"])
    specs = drafter_specs(cfg)
    assert cfg.model.target == "zoo:code-target"
    assert _options(specs, "small_model")["model"] == "zoo:code-draft"
    assert _options(specs, "medusa")["weights"] == "zoo:code-medusa"
    dataset = DatasetSpec.from_config(cfg.dataset)
    assert (dataset.path, dataset.num_examples, dataset.max_new_tokens) == ("zoo:complete", 24, 64)


@pytest.mark.parametrize(
    ("overrides", "label", "expected"),
    [
        (["drafter=small_model", "drafter.gamma=6", "model=zoo"], "small_model",
         {"gamma": 6, "model": "zoo:code-draft"}),
        (["drafter=small_model", "model.draft=/models/d"], "small_model", {"model": "/models/d"}),
        (["drafter.gamma=3", "drafter.policy=heuristic"], "small_model", {"gamma": 3, "policy": "heuristic"}),
        (["drafter=prompt_lookup", "drafter.max_ngram=5"], "prompt_lookup", {"max_ngram": 5, "policy": None}),
        (["drafter=eagle", "drafter.gamma=6", "model.eagle=random"], "eagle", {"gamma": 6, "weights": "random"}),
        (["drafter=medusa", "drafter.typical=true", "model=zoo"], "medusa",
         {"typical": True, "weights": "zoo:code-medusa"}),
    ],
)
def test_drafter_overrides(compose_config, overrides, label, expected):
    specs = drafter_specs(compose_config(overrides))
    options = _options(specs, label)
    assert {key: options[key] for key in expected} == expected
    assert specs[0].label == PLAIN
    if label in get_registry():
        validate_specs(specs)


def test_all_applies_shared_options_to_every_drafter(compose_config):
    specs = drafter_specs(compose_config(["drafter.gamma=3", "drafter.names=[small_model,prompt_lookup]"]))
    assert [spec.label for spec in specs] == [PLAIN, "small_model", "prompt_lookup"]
    assert all(spec.options["gamma"] == 3 for spec in specs[1:])


@pytest.mark.parametrize(
    ("overrides", "label"),
    [
        ([], "greedy"),
        (["sampling=t07"], "t0.7"),
        (["sampling=t1", "sampling.top_k=5"], "t1-k5"),
        (["sampling.temperature=0.7", "sampling.top_p=0.9"], "t0.7-p0.9"),
    ],
)
def test_sampling_overrides(compose_config, overrides, label):
    assert sampling_label(sampling_config(compose_config(overrides).sampling)) == label


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["dataset=continue"], {"path": "zoo:continue", "ids_field": "prompt_ids", "num_examples": 24}),
        (["dataset=jsonl", "dataset.data_files=p.jsonl"], {"path": "json", "data_files": "p.jsonl", "field": "prompt"}),
        (["experiment=quick"], {"num_examples": 4, "max_new_tokens": 32}),
        (["experiment=quick", "dataset.num_examples=2"], {"num_examples": 2}),
        (["dataset=humaneval"], {"path": "openai_humaneval", "split": "test", "id_field": "task_id"}),
        (["dataset=spec_bench"], {"name": "spec_bench", "path": "specfamily:spec_bench", "turns_field": "auto",
                                  "chat_template": True, "category_field": "auto", "select": "per_category",
                                  "num_examples": 1, "split": "auto"}),
        (["dataset.path=HuggingFaceH4/mt_bench_prompts"], {"name": "mt_bench_prompts", "field": "auto"}),
        (["dataset=jsonl", "dataset.path=openai/gsm8k"], {"path": "openai/gsm8k", "data_files": None}),
        (["dataset=gsm8k"], {"path": "openai/gsm8k", "config_name": "main", "split": "test", "field": "question"}),
        (["dataset=mt_bench"], {"path": "HuggingFaceH4/mt_bench_prompts", "turns_field": "prompt",
                                "id_field": "prompt_id", "category_field": "category"}),
        (["dataset=spec_bench", "dataset.max_turns=1"], {"max_turns": 1}),
    ],
)
def test_dataset_overrides(compose_config, overrides, expected):
    spec = DatasetSpec.from_config(compose_config(overrides).dataset)
    assert {key: getattr(spec, key) for key in expected} == expected


@pytest.mark.parametrize("path", sorted((configs_dir() / "dataset").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_dataset_file_lists_every_key(path):
    """Every dataset file names each DatasetSpec key, so any of them can be overridden without +."""
    assert set(OmegaConf.load(path)) == {f.name for f in dataclasses.fields(DatasetSpec)}


def test_sweep_gamma_experiment_is_a_multirun(compose_config):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
        cfg = compose("config", overrides=["experiment=sweep_gamma"], return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweeper.params["drafter.gamma"] == "1,2,3,4,6,8"


def test_misspelt_option_gets_the_registrys_error(compose_config):
    specs = drafter_specs(compose_config(["drafter=small_model", "+drafter.gama=3"]))
    with pytest.raises(TypeError, match=r"drafter 'small_model' got unknown option 'gama'; did you mean 'gamma'\?"):
        validate_specs(specs)


def test_misspelt_option_without_plus_is_refused_by_hydra(compose_config):
    with pytest.raises(ConfigCompositionException, match="gama"):
        compose_config(["drafter=small_model", "drafter.gama=3"])


def test_misspelt_option_in_a_shipped_or_user_file_is_the_registrys_error(compose_config):
    cfg = compose_config(["drafter=small_model"])
    cfg.drafter = OmegaConf.create({"name": "small_model", "gamma": 2, "polcy": "constant"})
    with pytest.raises(TypeError, match=r"unknown option 'polcy'; did you mean 'policy'\?"):
        validate_specs(drafter_specs(cfg))


def test_bad_option_value_is_the_schemas_error(compose_config):
    specs = drafter_specs(compose_config(["drafter=prompt_lookup", "drafter.min_ngram=0"]))
    with pytest.raises(ValueError, match="min_ngram must be an integer >= 1, got 0"):
        validate_specs(specs)


def test_unknown_drafter_name_suggests_the_nearest(compose_config):
    specs = drafter_specs(compose_config(["drafter.names=[small_modl]"]))
    with pytest.raises(ValueError, match=r"unknown drafter 'small_modl'; did you mean 'small_model'\?"):
        validate_specs(specs)


def test_all_refuses_keys_it_cannot_apply(compose_config):
    with pytest.raises(TypeError, match=r"drafter=all got unknown option\(s\) \['max_ngram'\]"):
        drafter_specs(compose_config(["+drafter.max_ngram=4"]))


@pytest.mark.parametrize("name", sorted(get_registry().names()))
def test_shipped_drafter_file_lists_the_registered_schema(name):
    """Each registered drafter ships drafter/<name>.yaml holding exactly its schema's options (so no key needs +)."""
    path = configs_dir() / "drafter" / f"{name}.yaml"
    assert path.is_file(), f"no shipped config for drafter {name!r}"
    keys = set(OmegaConf.load(path)) - {"name"}
    schema = {f.name for f in dataclasses.fields(get_registry().config_class(name)) if f.init}
    assert keys == schema


def test_configs_are_package_data():
    root = configs_dir()
    assert (root / "config.yaml").is_file()
    for group in ("model", "drafter", "dataset", "sampling", "experiment"):
        assert any((root / group).glob("*.yaml")), group
    assert {"medusa_modes.yaml", "gamma_arms.yaml"} <= {p.name for p in (root / "experiment").glob("*.yaml")}


def _arms(cfg):
    return [(spec.label, spec.name, spec.options) for spec in check_config(cfg)[1:]]


def test_labelled_arms_from_the_command_line():
    arms = "drafter.arms={tree: {name: medusa}, chain: {name: medusa, tree: chain}}"
    cfg = compose(["model=zoo", "drafter=arms", arms])
    arms = _arms(cfg)
    assert [(label, name, options["tree"]) for label, name, options in arms] == [
        ("tree", "medusa", None), ("chain", "medusa", "chain")]
    assert all(options["weights"] == "zoo:code-medusa" for _, _, options in arms)  # from drafter/medusa.yaml


@pytest.mark.parametrize(
    ("experiment", "expected"),
    [
        ("medusa_modes", [("medusa:tree", "medusa", "tree", None), ("medusa:chain", "medusa", "tree", "chain")]),
        ("gamma_arms", [("small_model:g2", "small_model", "gamma", 2), ("small_model:g4", "small_model", "gamma", 4),
                        ("small_model:g8", "small_model", "gamma", 8)]),
    ],
)
def test_shipped_arm_experiments(experiment, expected):
    arms = _arms(compose([f"experiment={experiment}", "model=zoo"]))
    key = expected[0][2]
    assert [(label, name, key, options[key]) for label, name, options in arms] == expected


def test_arms_in_a_config_file_with_every_kind_of_arm(compose_config):
    cfg = compose_config(["drafter=arms", "model=zoo"])
    cfg.drafter.arms = {"prompt_lookup": None, "wide:pl": {"name": "prompt_lookup", "branches": 3},
                        "eagle:chain": {"mode": "chain", "gamma": 3}}
    arms = _arms(cfg)
    assert [(label, name) for label, name, _ in arms] == [
        ("prompt_lookup", "prompt_lookup"), ("wide:pl", "prompt_lookup"), ("eagle:chain", "eagle")]
    assert (arms[0][2]["branches"], arms[1][2]["branches"], arms[2][2]["mode"], arms[2][2]["weights"]) == (
        None, 3, "chain", "zoo:code-eagle")  # None: the shipped default (1 greedy, 2 when sampling)


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ({"x": {"name": "medusa", "tre": "chain"}}, r"^drafter\.arms\.x: drafter 'medusa' got unknown option 'tre'"),
        ({"x": {"name": "medusa", "gamma": "abc"}}, r"^drafter\.arms\.x\.gamma must be an integer or null, got 'abc'$"),
        ({"x": {"name": "medusaa"}}, r"^drafter\.arms\.x: unknown drafter 'medusaa'; did you mean 'medusa'\?"),
        ({"x": {"name": "small_model", "model": "???"}}, r"^drafter\.arms\.x\.model: missing mandatory value"),
        ({"x": 3}, r"^drafter\.arms\.x: an arm is a mapping of options"),
        ({PLAIN: {"name": "medusa"}}, r"^drafter: arm labels must be distinct, non-empty, not 'plain'"),
        ({"a|b": {"name": "medusa"}}, r"^drafter: arm labels must be distinct"),
        ({}, r"^drafter\.arms: give at least one arm"),
    ],
)
def test_every_arm_is_checked_like_a_drafter(compose_config, arms, message):
    cfg = compose_config(["drafter=arms", "model=zoo"])
    cfg.drafter.arms = arms
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


def test_default_config_passes_the_check():
    specs = check_config(compose([]))
    assert [spec.label for spec in specs] == [PLAIN, *sf.list_drafters()]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["drafter=small_model", "drafter.confidence=abc"], "drafter.confidence must be a number, got 'abc'"),
        (["drafter=small_model", "drafter.policy=fastest"],
         "drafter.policy must be one of auto, constant, heuristic, optimal or null, got 'fastest'"),
        (["drafter=prompt_lookup", "drafter.gamma=4.5"], "drafter.gamma must be an integer or null, got 4.5"),
        (["drafter=medusa", "drafter.typical=maybe"], "drafter.typical must be true or false, got 'maybe'"),
        (["drafter.policy=fast"], "drafter.policy must be one of"),  # drafter=all's own option
        (["drafter.gamma=two"], "drafter.gamma must be an integer or null, got 'two'"),
        (["drafter=small_model", "+drafter.gama=3"], "drafter: drafter 'small_model' got unknown option 'gama'"),
        (["drafter=prompt_lookup", "drafter.min_ngram=0"], "drafter: min_ngram must be an integer >= 1, got 0"),
        (["dataset.path=???"], "dataset.path: missing mandatory value (???)"),
        (["dataset=jsonl"], "dataset: dataset 'jsonl': path 'json' reads the files named by data_files; set "
                            "dataset.data_files=FILE"),
        (["model.draft=${nope}", "drafter=small_model"], "model.draft: Interpolation key 'nope' not found"),
        (["sampling.temperature=-1"], "sampling: temperature must be a finite number >= 0, got -1"),
        (["dataset.select=random"], "dataset: dataset 'spec_bench': select must be one of"),
    ],
)
def test_config_errors_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        check_config(compose(overrides))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
