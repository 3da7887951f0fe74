"""`zoo:` names and shipped prompt sets resolve to package data, with clear errors otherwise."""

from __future__ import annotations

import pytest

import specfamily.zoo as zoo


def test_zoo_names():
    assert zoo.ZOO_NAMES == ("code-target", "code-draft", "code-medusa", "code-eagle", "code-skip", "smollm2",
                             "smollm2-draft", "smollm2-medusa", "smollm2-hydra", "smollm2-eagle", "smollm2-eagle3",
                             "smollm2-skip")
    assert zoo.is_zoo_name("zoo:code-target") and not zoo.is_zoo_name("code-target")


def test_unknown_name_suggests_the_nearest():
    with pytest.raises(ValueError, match=r"did you mean 'zoo:code-target'.*known: zoo:code-target, zoo:code-draft"):
        zoo.zoo_path("zoo:code-targt")
    with pytest.raises(ValueError, match="unknown zoo model 'gpt2'"):
        zoo.zoo_path("gpt2")
    with pytest.raises(TypeError):
        zoo.zoo_path(3)
    with pytest.raises(ValueError, match="did you mean 'continue'"):
        zoo.prompt_set_path("continu")


def test_prefix_optional_and_missing_folder_is_explained(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo.paths, "package_dir", lambda *parts: tmp_path.joinpath(*parts))
    with pytest.raises(FileNotFoundError, match="'zoo:code-medusa' is not shipped"):
        zoo.zoo_path("code-medusa")
    folder = tmp_path / "weights" / "code-draft"
    folder.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="not shipped"):  # a folder without config.json
        zoo.zoo_path("zoo:code-draft")
    (folder / "config.json").write_text("{}")
    assert zoo.zoo_path("zoo:code-draft") == zoo.zoo_path("code-draft") == folder
    with pytest.raises(FileNotFoundError, match=r"'zoo:code-skip' is not shipped .*code-target\.json\); make it "
                                                r"with `python -m specfamily\.drafters\.self_spec\.search "):
        zoo.zoo_path("zoo:code-skip")  # a skip set lies beside its drafter, outside the zoo package
    with pytest.raises(FileNotFoundError, match="specfamily-zoo prompts"):
        zoo.prompt_set_path("complete")


def test_lookup_is_inside_the_installed_package():
    path = zoo.paths.package_dir("weights", "code-target")
    assert path.parent.parent == __import__("pathlib").Path(zoo.__file__).parent
