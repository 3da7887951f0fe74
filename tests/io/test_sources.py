"""Hub names that cannot be reached: one line that says what to do, not a long traceback."""

import pytest

import specfamily as sf
from specfamily.eval.datasets import DatasetSpec, load_rows
from specfamily.io.sources import UnreachableError


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def test_an_unreachable_model_name_says_to_pass_a_local_copy(offline):
    with pytest.raises(UnreachableError) as info:
        sf.load_target("nobody-here/no-such-model-xyz")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("model 'nobody-here/no-such-model-xyz' is not a local folder and the model hub did not")
    assert "hf download nobody-here/no-such-model-xyz --local-dir DIR" in message and "model.target=DIR" in message


def test_an_unreachable_dataset_name_says_to_use_a_local_file(offline):
    spec = DatasetSpec(name="x", path="nobody-here/no-such-dataset-xyz", split="test")
    with pytest.raises(UnreachableError) as info:
        load_rows(spec)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("dataset 'nobody-here/no-such-dataset-xyz' is not a local file and the hub did not")
    assert "dataset=jsonl dataset.data_files=prompts.jsonl" in message


def test_a_missing_local_file_is_not_called_a_hub_problem(tmp_path):
    spec = DatasetSpec(name="x", path="json", data_files=str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError):
        load_rows(spec)
