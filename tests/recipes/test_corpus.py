"""The corpus split is deterministic, by file, and independent of the Python build."""

from __future__ import annotations

import pytest

from specfamily.recipes.corpus import is_heldout, load_corpus


def test_split_is_deterministic_and_by_file(tiny_corpus):
    first, second = load_corpus(tiny_corpus), load_corpus(tiny_corpus)
    assert first.metadata() == second.metadata()
    train = {d.path for d in first.train}
    heldout = {d.path for d in first.heldout}
    assert heldout and train and not train & heldout
    assert all(is_heldout(path) for path in heldout) and not any(is_heldout(path) for path in train)
    for doc in first.train + first.heldout:  # whole files, unchanged
        assert doc.text == (tiny_corpus / doc.path).read_text()


def test_split_depends_only_on_the_relative_path():
    assert is_heldout("pkg/mod_103.py") and not is_heldout("pkg/mod_0.py")
    assert is_heldout("anything.py", heldout_percent=100.0) and not is_heldout("anything.py", heldout_percent=0.0)


def test_skips_undecodable_blank_and_site_packages(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "blank.py").write_text("  \n")
    (tmp_path / "bad.py").write_bytes(b"\xff\xfe\xfa")
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "dep.py").write_text("y = 2\n")
    corpus = load_corpus(tmp_path, heldout_percent=0.0)
    assert [d.path for d in corpus.train] == ["a.py"]
    assert corpus.skipped == ["bad.py"]


def test_hash_covers_contents(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    before = load_corpus(tmp_path).file_list_hash()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert load_corpus(tmp_path).file_list_hash() != before


def test_empty_or_missing_root_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no readable"):
        load_corpus(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        load_corpus(tmp_path / "missing")
