"""What run.json records about a dataset: the split auto picks, the revision of hub and local copies."""

from __future__ import annotations

import subprocess

import pytest

from specfamily.eval.dataset_source import local_revision, pick_split, revision_of

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_split_auto_prefers_test_then_validation_then_train():
    assert pick_split(["train", "validation", "test"], "auto") == "test"
    assert pick_split(["train", "validation"], "auto") == "validation"
    assert pick_split(["train_sft", "test_sft"], "auto") == "test_sft"
    assert pick_split(["only"], "auto") == "only" and pick_split(["a", "b"], "b") == "b"
    with pytest.raises(ValueError, match="split auto: the dataset has none of test, validation, train but a, b"):
        pick_split(["a", "b"], "auto")


def test_hub_revision_is_the_builders_commit_and_files_have_none(tmp_path):
    assert revision_of("openai/gsm8k", None, None, SHA) == SHA
    assert revision_of("openai/gsm8k", None, "v1.0", "auto") == "v1.0"  # the hub's cache without a commit: the pin
    assert revision_of("json", "p.jsonl", None, "abc") is None
    (tmp_path / "p.jsonl").write_text("{}\n")
    assert revision_of(str(tmp_path / "p.jsonl"), None, None, "abc") is None


def test_a_local_copy_made_by_hf_download_names_its_commit(tmp_path):
    from huggingface_hub._local_folder import write_download_metadata

    (tmp_path / "README.md").write_text("---\n---\n")
    write_download_metadata(tmp_path, "README.md", SHA, "etag")
    assert local_revision(tmp_path) == revision_of(str(tmp_path), None, None, "xyz") == SHA
    assert local_revision(tmp_path / "README.md") is None


def test_a_git_clone_names_its_head(tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "README.md").write_text("x\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert local_revision(tmp_path) == head and len(head) == 40
