import os
import stat

import pytest

from specfamily.io.files import write_atomically, write_folder_atomically, write_text_atomically


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir())


def test_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_text_atomically(path, "one")
    write_text_atomically(path, "two")
    assert path.read_text() == "two"
    assert _siblings(path) == ["a.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_a_failing_writer_keeps_the_old_file_and_cleans_up(tmp_path):
    path = tmp_path / "a.npy"
    path.write_text("old")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(path, broken)
    assert path.read_text() == "old"
    assert _siblings(path) == ["a.npy"]


def test_the_temporary_keeps_the_suffix(tmp_path):
    seen = []
    write_atomically(tmp_path / "plot.png", lambda tmp: seen.append(tmp.suffix) or tmp.write_bytes(b"x"))
    assert seen == [".png"]


def test_folder_is_swapped_in_whole(tmp_path):
    folder = tmp_path / "ckpt"
    write_folder_atomically(folder, lambda tmp: (tmp / "a.txt").write_text("1"))
    write_folder_atomically(folder, lambda tmp: (tmp / "b.txt").write_text("2"))
    assert sorted(p.name for p in folder.iterdir()) == ["b.txt"]
    assert _siblings(folder) == ["ckpt"]


def test_a_failing_folder_fill_keeps_the_old_folder(tmp_path):
    folder = tmp_path / "ckpt"
    write_folder_atomically(folder, lambda tmp: (tmp / "a.txt").write_text("1"))

    def broken(tmp):
        (tmp / "b.txt").write_text("half")
        raise OSError("no space")

    with pytest.raises(OSError, match="no space"):
        write_folder_atomically(folder, broken)
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]
    assert _siblings(folder) == ["ckpt"]
