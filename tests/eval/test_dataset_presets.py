"""The hub presets (dataset=mt_bench, gsm8k, wmt14, cnn_dailymail, nq_open) and dataset.path=NAME alone, read from
local folders written in the hub's layout with the real datasets' column names (no hub here); the chat-template
override; where the prompts came from (revision, fingerprint)."""

from __future__ import annotations

import dataclasses

import pytest
from eval_helpers import CHAT_TEMPLATE, chat_tokenizer, tiny_tokenizer
from hub_layout import CNN_DAILYMAIL, GSM8K, MT_BENCH, NQ_OPEN, SHAREGPT, WMT14, write_hub_copies
from omegaconf import OmegaConf

from specfamily.eval.config import configs_dir
from specfamily.eval.datasets import DatasetSpec, load_prompt_set, turn_prompt_ids
from specfamily.io.chat import chat_prompt_ids

HUB_PATHS = {"mt_bench": "HuggingFaceH4/mt_bench_prompts", "gsm8k": "openai/gsm8k", "wmt14": "wmt/wmt14",
             "cnn_dailymail": "abisee/cnn_dailymail", "nq_open": "google-research-datasets/nq_open"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return write_hub_copies(tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


def _preset(name: str, **options) -> DatasetSpec:
    node = OmegaConf.load(configs_dir() / "dataset" / f"{name}.yaml")
    return DatasetSpec.from_config({**OmegaConf.to_container(node), **options})


def _user_ids(tok, text: str) -> list[int]:
    return chat_prompt_ids(tok, [text])


@pytest.mark.parametrize("name", sorted(HUB_PATHS))
def test_each_preset_names_its_hub_dataset_split_and_chat_template(name):
    spec = _preset(name)
    assert spec.path == HUB_PATHS[name] and spec.chat_template is True and spec.name == name
    assert spec.split in ("train", "test", "validation")


def test_mt_bench_preset_asks_both_turns_one_question_per_category(hub, tok):
    prompts, source = load_prompt_set(_preset("mt_bench", path=str(hub["mt_bench"])), tok)
    assert [(p.id, p.category, p.n_turns) for p in prompts] == [("58093402", "writing", 2), ("19227631", "roleplay", 2),
                                                                  ("77120985", "math", 2)]
    assert prompts[0].ids == _user_ids(tok, MT_BENCH[0]["prompt"][0])
    spec = _preset("mt_bench", path=str(hub["mt_bench"]))
    second = turn_prompt_ids(spec, prompts[0], ["Drops fall."], tok)
    assert second == chat_prompt_ids(tok, MT_BENCH[0]["prompt"], ["Drops fall."])
    assert (source.split, source.rows, source.columns) == ("train", 4, {"turns_field": "prompt", "id_field":
                                                                         "prompt_id", "category_field": "category"})


@pytest.mark.parametrize(
    ("name", "texts"),
    [
        ("gsm8k", [row["question"] for row in GSM8K]),
        ("wmt14", [f"Translate German to English: {row['translation']['de']}" for row in WMT14]),
        ("cnn_dailymail", [f"Summarize: {row['article']}" for row in CNN_DAILYMAIL]),
        ("nq_open", [row["question"] for row in NQ_OPEN]),
    ],
)
def test_single_turn_presets_read_their_split_and_fields(hub, tok, name, texts):
    prompts, source = load_prompt_set(_preset(name, path=str(hub[name])), tok)
    assert [p.ids for p in prompts] == [_user_ids(tok, text) for text in texts]
    assert source.split == _preset(name).split and source.config_name == _preset(name).config_name
    assert source.rows == len(texts) and len(source.fingerprint) == 16 and len(source.rows_sha256) == 64


def test_path_alone_on_the_default_config_reads_turns_text_and_messages(hub, tok):
    default = _preset("spec_bench")
    mt = load_prompt_set(dataclasses.replace(default, path=str(hub["mt_bench"]), num_examples=None), tok)[0]
    assert [p.turns for p in mt] == [tuple(row["prompt"]) for row in MT_BENCH]  # prompt: a list of turns
    assert [p.category for p in mt] == [row["category"] for row in MT_BENCH]
    gsm, source = load_prompt_set(dataclasses.replace(default, path=str(hub["gsm8k"]), config_name="main"), tok)
    assert [p.ids for p in gsm] == [_user_ids(tok, GSM8K[0]["question"])]  # per_category without categories: spread
    assert (source.split, source.columns) == ("test", {"field": "question"})
    share = load_prompt_set(dataclasses.replace(default, path=str(hub["sharegpt"])), tok)[0]
    assert [(p.id, p.turns, p.system) for p in share] == [("c1", ("Hi there.", "Name a colour."), "Be brief."),
                                                          ("c2", ("Count to three.",), None)][:1]
    assert share[0].ids == chat_prompt_ids(tok, ["Hi there."], (), "Be brief.")
    spec = dataclasses.replace(default, path=str(hub["sharegpt"]))
    assert turn_prompt_ids(spec, share[0], ["Hey."], tok) == chat_prompt_ids(tok, ["Hi there.", "Name a colour."],
                                                                             ["Hey."], "Be brief.")
    ultra, source = load_prompt_set(dataclasses.replace(default, path=str(hub["ultrachat"]), num_examples=None), tok)
    assert [(p.id, p.turns) for p in ultra] == [("u1", ("Say yes.",)), ("u2", ("Say no.", "Again."))]
    assert (source.split, source.columns["messages_field"]) == ("test_sft", "messages")


def test_sharegpt_all_rows_and_an_explicit_system_prompt_wins(hub, tok):
    spec = dataclasses.replace(_preset("spec_bench"), path=str(hub["sharegpt"]), num_examples=None,
                               system_prompt="Config says.")
    prompts = load_prompt_set(spec, tok)[0]
    assert [p.id for p in prompts] == [row["id"] for row in SHAREGPT]
    assert prompts[0].ids == chat_prompt_ids(tok, ["Hi there."], (), "Config says.")


def test_chat_template_override_as_string_or_file_with_keyword_arguments(hub, tmp_path):
    tok = tiny_tokenizer()  # no chat template of its own
    template = "{% for m in messages %}[{{ m['role'] }}{{ '!' if shout else '' }}]{{ m['content'] }}{% endfor %}[bot]"
    (tmp_path / "t.jinja").write_text(template)
    spec = _preset("gsm8k", path=str(hub["gsm8k"]), num_examples=1)
    with pytest.raises(ValueError, match="the target's tokenizer has none; give one with dataset.chat_template="):
        load_prompt_set(spec, tok)
    expected = tok(f"[user!]{GSM8K[0]['question']}[bot]", add_special_tokens=False)["input_ids"]
    for value in (template, str(tmp_path / "t.jinja")):
        shout = dataclasses.replace(spec, chat_template=value, chat_template_kwargs={"shout": True})
        assert load_prompt_set(shout, tok)[0][0].ids == expected
    quiet = dataclasses.replace(spec, chat_template=template)
    assert tok.decode(load_prompt_set(quiet, tok)[0][0].ids).startswith("[user]Tom")


def test_a_dataset_of_several_configurations_asks_for_one(hub, tok):
    spec = dataclasses.replace(_preset("spec_bench"), path=str(hub["gsm8k"]))
    with pytest.raises(ValueError, match=r"dataset 'spec_bench': '.*gsm8k' has several configurations \['main', "
                                         r"'socratic'\]; choose one with dataset.config_name=NAME"):
        load_prompt_set(spec, tok)


def test_a_misspelt_explicit_column_is_an_error_not_a_guess(hub, tok):
    with pytest.raises(ValueError, match=r"dataset 'gsm8k' has no field 'questoin'; its fields are: question, answer"):
        load_prompt_set(_preset("gsm8k", path=str(hub["gsm8k"]), field="questoin"), tok)


def test_auto_spec_bench_is_the_explicit_one():
    """The default config's auto keys find Spec-Bench's own columns: the same prompts as naming them."""
    tok = chat_tokenizer()
    auto = _preset("spec_bench")
    explicit = dataclasses.replace(auto, split="train", field=None, messages_field=None, turns_field="turns",
                                   id_field="question_id", category_field="category")
    (a, source), (e, _) = load_prompt_set(auto, tok), load_prompt_set(explicit, tok)
    assert a == e and len(a) == 13 and source.split == "train" and source.revision is None
    assert source.columns == {"turns_field": "turns", "id_field": "question_id", "category_field": "category"}
    assert CHAT_TEMPLATE == tok.chat_template


def test_a_preset_on_a_local_hub_copy_runs_and_run_json_keeps_its_revision(chat_pair, compose_config, tmp_path):
    """dataset=mt_bench with one override (the path of a git clone in the hub's layout) runs both turns of every
    question for each arm, and run.json says which commit, split and rows the prompts came from."""
    import json
    import subprocess

    from eval_helpers import _run_overrides

    from specfamily.eval.runner import run_experiment

    folder = write_hub_copies(tmp_path / "hub")["mt_bench"]
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    overrides = [*_run_overrides(chat_pair["target"], chat_pair["target"], "exact"), "dataset=mt_bench",
                 f"dataset.path={folder}", "dataset.max_new_tokens=4"]
    outcome = run_experiment(compose_config(overrides), tmp_path / "run")
    ids = sorted({(r.prompt_id, r.category) for r in outcome.records})
    assert ids == [("19227631", "roleplay"), ("19227631:turn2", "roleplay"), ("58093402", "writing"),
                   ("58093402:turn2", "writing"), ("77120985", "math"), ("77120985:turn2", "math")]
    assert sorted({r.drafter for r in outcome.records}) == ["plain", "small_model"]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    source = run["dataset_source"]
    assert (run["dataset"], source["path"], source["split"], source["revision"]) == ("mt_bench", str(folder), "train",
                                                                                      head)
    assert source["rows"] == 4 and len(source["fingerprint"]) == 16 and len(source["rows_sha256"]) == 64
    assert source["columns"] == {"turns_field": "prompt", "id_field": "prompt_id", "category_field": "category"}
