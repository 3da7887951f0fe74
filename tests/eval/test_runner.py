"""The comparison runner end to end on tiny saved models: results, failures, resumption, chat turns."""

from __future__ import annotations

import json

import pytest
from eval_helpers import QUESTIONS, TEXTS, chat_overrides, tiny_overrides
from transformers import AutoModelForCausalLM, AutoTokenizer

import specfamily.eval.runner as runner
from specfamily.core.drafter import BaseDrafter
from specfamily.core.plugins import get_registry, reset_plugins
from specfamily.eval.datasets import DatasetSpec, load_prompts
from specfamily.eval.environment import prompts_fingerprint, weights_hash
from specfamily.eval.results import FailureRecord, PromptRecord, RunInfo, read_records
from specfamily.eval.runner import run_experiment
from specfamily.io.chat import answer_text, chat_prompt_ids


def _prompts(records, label):
    return [r for r in records if isinstance(r, PromptRecord) and r.drafter == label]


def test_local_jsonl_end_to_end(tiny_pair, compose_config, tmp_path):
    cfg = compose_config(tiny_overrides(tiny_pair, f"model.draft={tiny_pair['target']}"))
    outcome = run_experiment(cfg, tmp_path)
    records = read_records(tmp_path / "results.jsonl")
    plain, small = _prompts(records, "plain"), _prompts(records, "small_model")
    assert [r.prompt_id for r in plain] == [r.prompt_id for r in small] == ["p0", "p1", "p2"]
    assert [r.drafter for r in records] == ["plain", "small_model"] * 3  # prompt-major, plain first
    assert [r.tokens for r in small] == [r.tokens for r in plain]  # greedy: identical text
    assert all(len(r.tokens) == 10 and r.wall_seconds > 0 and not r.lossy for r in records)
    assert [r.seed for r in plain] == [0, 1, 2]
    # the draft model is the target itself: every draft token is accepted, and a draft step costs a whole pass, so
    # the cost-aware policy drafts on the first prompt (c unknown yet), then says why it stopped
    drafted = [r for r in small if r.metrics["proposed_tokens"]]
    assert small[0] in drafted and small[0].metrics["mean_accepted_length"] > 1
    assert all(r.metrics["acceptance_rate"] == 1.0 for r in drafted)
    assert all(r.metrics["policy_note"].startswith("drafted in ") for r in small)
    assert all(r.metrics["mean_accepted_length"] == 1.0 for r in plain)
    info = RunInfo.load(tmp_path)
    assert info.config["dataset"]["max_new_tokens"] == 10 and info.seed == 0
    assert info.versions["torch"] and info.versions["transformers"] and "git" in json.loads(
        (tmp_path / "run.json").read_text())
    assert set(info.verify_cost) == {"0", "1", "2"} and info.verify_cost["0"] == 1.0
    assert (tmp_path / "summary.csv").is_file() and (tmp_path / "report.md").is_file()
    assert "| small_model | - | ok | 3 |" in outcome.table  # cost-aware (no gamma given): no fixed length
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["target"])
    assert [r.prompt for r in plain] == TEXTS[:3]  # the prompt as the model saw it
    assert all(r.text == tokenizer.decode(r.tokens) and r.text for r in records)


def test_run_json_records_the_environment_and_the_noise(tiny_pair, compose_config, tmp_path):
    cfg = compose_config(tiny_overrides(tiny_pair, "dataset.num_examples=4", "++noise.repeats=2"))
    run_experiment(cfg, tmp_path)
    info, saved = RunInfo.load(tmp_path), json.loads((tmp_path / "run.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    assert info.weights == weights_hash(target)  # the run hashed the very weights it decoded with
    prompts = load_prompts(DatasetSpec.from_config(cfg.dataset), AutoTokenizer.from_pretrained(tiny_pair["target"]))
    assert info.dataset_fingerprint == prompts_fingerprint(prompts)
    assert isinstance(info.plugins, list) and info.versions["scipy"]
    assert info.hardware["torch_threads"] == info.threads == 1 and info.hardware["cpu"]
    assert {"gpu", "cuda", "usable_cpus", "load_average_1m"} <= set(saved["hardware"])
    assert len(info.pass_seconds) == 3 and all(set(r) == {"0", "1", "2"} for r in info.pass_seconds)
    assert info.verify_cost["0"] == 1.0 and set(info.verify_cost) == {"0", "1", "2"}
    repeats = read_records(tmp_path / "repeats.jsonl")
    plain = _prompts(read_records(tmp_path / "results.jsonl"), "plain")
    assert [(r.repeat, r.after, r.prompt_id) for r in repeats] == [(1, 2, "p0"), (2, 4, "p0")]  # mid-run, at the end
    assert all(r.tokens == plain[0].tokens and r.wall_seconds > 0 for r in repeats)
    assert [check["name"] for check in saved["noise"]] == ["plain_repeats", "verify_cost"]
    assert saved["noise"][0]["samples"] == 3 and saved["noise"][0]["threshold"] == 0.10
    assert "## Noise" in (tmp_path / "report.md").read_text()


def test_a_bad_noise_setting_is_an_error_before_any_model_loads(tiny_pair, compose_config, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "load_model_target", None)
    with pytest.raises(ValueError, match="noise.threshold must be a number > 0"):
        run_experiment(compose_config(tiny_overrides(tiny_pair, "++noise.threshold=0")), tmp_path)


class BrokenDrafter(BaseDrafter):
    """Cannot even be built."""

    def __init__(self, target, **options):
        raise FileNotFoundError("zoo model 'zoo:code-broken' is not shipped")


class LateFailingDrafter(BaseDrafter):
    """Drafts nothing useful and raises on its second request (prompt 0, then prompt 1: the warm-up runs on a
    drafter object of its own)."""

    def __init__(self, target, **options):
        super().__init__(gamma=2)
        self.requests = 0

    def begin(self, ctx):
        super().begin(ctx)
        self.requests += 1
        if self.requests == 2:
            raise RuntimeError("boom on the second prompt")

    def propose(self, ctx, gamma):
        from specfamily.core.types import Draft

        return Draft.chain([0] * gamma)


@pytest.fixture
def failing_drafters():
    registry = get_registry()
    registry.register("broken", BrokenDrafter)
    registry.register("late_failure", LateFailingDrafter)
    yield
    reset_plugins()


def test_raising_drafters_are_recorded_and_the_others_finish(tiny_pair, compose_config, tmp_path, failing_drafters):
    overrides = tiny_overrides(tiny_pair, "drafter.names=[broken,late_failure,small_model]")
    outcome = run_experiment(compose_config(overrides), tmp_path)
    records = read_records(tmp_path / "results.jsonl")
    failures = {r.drafter: r for r in records if isinstance(r, FailureRecord)}
    assert failures["broken"].stage == "create" and failures["broken"].prompt_id is None
    assert failures["broken"].error == "FileNotFoundError: zoo model 'zoo:code-broken' is not shipped"
    assert failures["late_failure"].stage == "generate" and failures["late_failure"].prompt_id == "p1"
    assert "boom on the second prompt" in failures["late_failure"].traceback
    assert [r.prompt_id for r in _prompts(records, "late_failure")] == ["p0"]
    assert len(_prompts(records, "small_model")) == len(_prompts(records, "plain")) == 3
    assert "| broken | - | failed | 0 |" in outcome.table
    report = (tmp_path / "report.md").read_text()
    assert "- `late_failure`: generate: RuntimeError: boom on the second prompt" in report


def test_killed_run_resumes_without_redoing_finished_work(tiny_pair, compose_config, tmp_path, monkeypatch):
    cfg = compose_config(tiny_overrides(tiny_pair))
    run_experiment(cfg, tmp_path)
    full = read_records(tmp_path / "results.jsonl")
    lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "results.jsonl").write_text("".join(lines[:3]) + lines[3][:40])  # killed while writing line 4
    ran = []

    def counting(plan, arm, prompt, turn=1, ids=None):
        ran.append((arm.label, prompt.id))
        return real(plan, arm, prompt, turn, ids)

    real = runner.run_prompt
    monkeypatch.setattr(runner, "run_prompt", counting)
    repeats = (tmp_path / "repeats.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "repeats.jsonl").write_text(repeats[0])  # killed before the second repeat
    run_experiment(cfg, tmp_path)
    assert ran == [(r.drafter, r.prompt_id) for r in full[3:]]
    assert [r.repeat for r in read_records(tmp_path / "repeats.jsonl")] == [1, 2, 3]  # each once
    resumed = read_records(tmp_path / "results.jsonl")
    assert [(r.drafter, r.prompt_id, r.tokens) for r in resumed] == [(r.drafter, r.prompt_id, r.tokens) for r in full]
    monkeypatch.setattr(runner, "load_model_target", None)  # finished: not even the target is loaded again
    assert [r.tokens for r in run_experiment(cfg, tmp_path).records] == [r.tokens for r in full]


def test_resume_with_a_different_config_is_refused(tiny_pair, compose_config, tmp_path):
    run_experiment(compose_config(tiny_overrides(tiny_pair, "dataset.num_examples=1")), tmp_path)
    changed = compose_config(tiny_overrides(tiny_pair, "dataset.num_examples=1", "sampling=t07"))
    with pytest.raises(ValueError, match="holds a run with a different sampling config"):
        run_experiment(changed, tmp_path)


@pytest.fixture
def asked(monkeypatch):
    """Every timed generation's (arm, record id, prompt ids), in order."""
    calls = []
    real = runner.run_prompt

    def recording(plan, arm, prompt, turn=1, ids=None):
        record = real(plan, arm, prompt, turn, ids)
        calls.append((arm.label, record.prompt_id, list(ids)))
        return record

    monkeypatch.setattr(runner, "run_prompt", recording)
    return calls


def test_second_turn_is_asked_after_each_arms_own_first_answer(chat_pair, compose_config, tmp_path, asked):
    run_experiment(compose_config(chat_overrides(chat_pair, "sampling=t1")), tmp_path)
    records = read_records(tmp_path / "results.jsonl")
    assert [(r.drafter, r.prompt_id, r.turn, r.category) for r in records] == [
        ("plain", "7", 1, "writing"), ("small_model", "7", 1, "writing"),
        ("plain", "7:turn2", 2, "writing"), ("small_model", "7:turn2", 2, "writing"),
        ("plain", "8", 1, "qa"), ("small_model", "8", 1, "qa"),
    ]
    tokenizer = AutoTokenizer.from_pretrained(chat_pair["target"])
    prompts = {(label, record_id): ids for label, record_id, ids in asked}
    first = {r.drafter: answer_text(tokenizer, r.tokens) for r in records if r.prompt_id == "7"}
    assert first["plain"] != first["small_model"]  # sampled: each arm has its own answer to build on
    for label, answer in first.items():
        second = prompts[label, "7:turn2"]
        assert second == chat_prompt_ids(tokenizer, QUESTIONS[0]["turns"], [answer])
        assert f"<|assistant|>{answer}<|end|>\n<|user|>Now shorter." in tokenizer.decode(second)
    assert prompts["plain", "7"] == prompts["small_model", "7"] == chat_prompt_ids(tokenizer, ["Write a line."])
    assert all(r.prompt_tokens == len(prompts[r.drafter, r.prompt_id]) for r in records)
    assert all(r.prompt == tokenizer.decode(prompts[r.drafter, r.prompt_id]) for r in records)
    plain_first = next(r for r in records if r.key == ("plain", "7"))
    assert [r.tokens for r in read_records(tmp_path / "repeats.jsonl")] == [plain_first.tokens] * 2  # same seed
    assert RunInfo.load(tmp_path).prompts == 3  # records per arm: one per turn
    report = (tmp_path / "report.md").read_text()
    assert "## By category" in report and "| writing | 2 |" in report and "| qa | 1 |" in report
    assert "## By turn" in report and (tmp_path / "breakdown.csv").is_file()


def test_resumed_second_turn_builds_on_the_saved_first_answer(chat_pair, compose_config, tmp_path, asked):
    # a constant gamma: the cost-aware policy's lengths follow timings and what earlier requests taught it, so a
    # resumed sampled run would draw from the same law but not the same tokens
    cfg = compose_config(chat_overrides(chat_pair, "sampling=t1", "drafter.gamma=2"))
    run_experiment(cfg, tmp_path)
    full = read_records(tmp_path / "results.jsonl")
    first_asked = {(label, record_id): ids for label, record_id, ids in asked}
    lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "results.jsonl").write_text("".join(lines[:2]))  # killed after both arms answered turn 1
    asked.clear()
    run_experiment(cfg, tmp_path)
    assert sorted((label, record_id) for label, record_id, _ in asked) == sorted(r.key for r in full[2:])
    for label, record_id, ids in asked:  # the same turn-2 prompts, rebuilt from the saved answers
        assert ids == first_asked[label, record_id]
    resumed = read_records(tmp_path / "results.jsonl")
    assert [(r.prompt_id, r.tokens) for r in resumed] == [(r.prompt_id, r.tokens) for r in full]


def test_first_turns_only(chat_pair, compose_config, tmp_path):
    run_experiment(compose_config(chat_overrides(chat_pair, "dataset.max_turns=1")), tmp_path)
    records = read_records(tmp_path / "results.jsonl")
    assert [(r.prompt_id, r.turn) for r in records] == [("7", 1), ("7", 1), ("8", 1), ("8", 1)]
    assert "## By turn" not in (tmp_path / "report.md").read_text()


def test_the_warm_up_runs_on_a_drafter_object_of_its_own(monkeypatch):
    """A drafter that learns across requests (suffix's global cache) must not start the timed prompts primed with
    the warm-up's answer: the warm-up builds its own drafter from the arm's options."""
    from types import SimpleNamespace

    import specfamily as sf
    from specfamily.eval import runner
    from specfamily.testing import tiny_target

    target = tiny_target("llama", vocab_size=16)
    spec = SimpleNamespace(plain=False, name="suffix", options={"gamma": 2}, label="suffix")
    timed = sf.create_drafter("suffix", target, gamma=2)
    arm = runner.Arm(spec, drafter=timed)
    used = []
    monkeypatch.setattr(sf, "generate", lambda target, drafter, *args, **kwargs: used.append(drafter))
    plan = SimpleNamespace(warmup=2, target=target, warmup_tokens=4, seed=0, sampling=sf.SamplingConfig(),
                           info=SimpleNamespace(rank=0))
    runner._warm_up(plan, arm, SimpleNamespace(ids=[1, 2, 3], index=0), writer=None)
    assert len(used) == 2 and all(type(d) is type(timed) and d is not timed for d in used)
    assert arm.drafter is timed and not arm.failed


def test_drafter_all_leaves_out_what_has_no_weights_for_this_target(tiny_pair, compose_config, tmp_path, caplog):
    """The tiny target is no zoo target: hydra and eagle3 have no default weights and rest no datastore for it, so
    drafter=all leaves them out, saying why, instead of recording failed arms; a drafter named alone still fails."""
    overrides = tiny_overrides(tiny_pair, "drafter.names=[prompt_lookup,hydra,eagle3,rest]")
    with caplog.at_level("WARNING", logger="specfamily.eval.runner"):
        outcome = run_experiment(compose_config(overrides), tmp_path / "all")
    records = read_records(tmp_path / "all" / "results.jsonl")
    assert [r for r in records if isinstance(r, FailureRecord)] == [] and outcome.failed_drafters == []
    assert len(_prompts(records, "prompt_lookup")) == len(_prompts(records, "plain")) == 3
    left_out = [m for m in caplog.messages if m.startswith("drafter=all leaves ")]
    assert [m.split()[2] for m in left_out] == ["hydra", "eagle3", "rest"]
    assert "there are no hydra weights for this target in the zoo" in left_out[0]
    alone = [o for o in tiny_overrides(tiny_pair) if not o.startswith("drafter.names")] + ["drafter=hydra"]
    run_experiment(compose_config(alone), tmp_path / "alone")
    [failure] = [r for r in read_records(tmp_path / "alone" / "results.jsonl") if isinstance(r, FailureRecord)]
    assert failure.drafter == "hydra" and failure.error.startswith("NoWeights: there are no hydra weights")


def test_drafter_all_on_the_code_target_builds_every_arm_or_leaves_it_out_by_name(compose_config, tmp_path,
                                                                                  monkeypatch):
    """A fresh clone's ``model=zoo drafter=all``: every arm is built (rest builds its datastore on first use), or
    the zoo has no default weights for it here (eagle3 and hydra: none trained for the code target; merge: its
    default eagle3 part) and the run leaves it out; nothing else fails."""
    import specfamily as sf
    import specfamily.drafters.rest.default_store as default_store
    from specfamily.eval.config import drafter_specs
    from specfamily.zoo import NoWeights

    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))  # no datastore built yet, as on a fresh clone
    monkeypatch.setattr(default_store.build_default, "__defaults__", (3000, False))  # a small one, for speed
    specs = [spec for spec in drafter_specs(compose_config(["model=zoo", "drafter=all"])) if not spec.plain]
    assert {spec.name for spec in specs} == set(sf.list_drafters()) and all(spec.optional for spec in specs)
    target = sf.load_target("zoo:code-target")
    built, left_out = [], []
    for spec in specs:
        try:
            sf.create_drafter(spec.name, target, **spec.options)
            built.append(spec.name)
        except NoWeights:
            left_out.append(spec.name)
    assert sorted(left_out) == ["eagle3", "hydra", "merge"]
    assert {"rest", "eagle", "medusa", "small_model", "suffix"} <= set(built)
