"""Local folders written in the hub's layout (no hub here): parquet files under the folders the hub uses, and a
README.md whose YAML header names each configuration's files, as the hub's dataset cards do."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset

MT_BENCH = [  # HuggingFaceH4/mt_bench_prompts: prompt (the user turns), prompt_id, category, reference
    {"prompt": ["Write a haiku about rain.", "Now make it about snow."], "prompt_id": 58093402, "category": "writing",
     "reference": []},
    {"prompt": ["Pretend to be a pirate. Greet me.", "Say goodbye."], "prompt_id": 19227631, "category": "roleplay",
     "reference": []},
    {"prompt": ["What is 2 + 3 * 4?", "And (2 + 3) * 4?"], "prompt_id": 77120985, "category": "math",
     "reference": ["14", "20"]},
    {"prompt": ["Write a poem about code.", "Shorter."], "prompt_id": 40391833, "category": "writing",
     "reference": []},
]
GSM8K = [  # openai/gsm8k (main): question, answer
    {"question": "Tom has 3 apples and buys 2 more. How many apples does he have?", "answer": "3 + 2 = 5\n#### 5"},
    {"question": "A box holds 4 pens. How many pens are in 3 boxes?", "answer": "4 * 3 = 12\n#### 12"},
    {"question": "Ann reads 5 pages a day. How many pages in a week?", "answer": "5 * 7 = 35\n#### 35"},
]
WMT14 = [  # wmt/wmt14 (de-en): translation {de, en}
    {"translation": {"de": "Das Haus ist klein .", "en": "The house is small ."}},
    {"translation": {"de": "Der Hund schläft .", "en": "The dog is sleeping ."}},
]
CNN_DAILYMAIL = [  # abisee/cnn_dailymail (3.0.0): article, highlights, id
    {"article": "The city opened a new park on Monday. Families came early.", "highlights": "New park opens.",
     "id": "a1b2"},
    {"article": "Rain is expected all week. Officials urge caution.", "highlights": "Rainy week ahead.",
     "id": "c3d4"},
]
NQ_OPEN = [  # google-research-datasets/nq_open (nq_open): question, answer (a list)
    {"question": "who wrote the declaration of independence", "answer": ["Thomas Jefferson"]},
    {"question": "when did the first man land on the moon", "answer": ["1969", "July 20, 1969"]},
]
SHAREGPT = [  # a ShareGPT-style chat set: id, conversations [{from, value}], a system message first
    {"id": "c1", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi there."},
                                   {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Name a colour."},
                                   {"from": "gpt", "value": "Blue."}]},
    {"id": "c2", "conversations": [{"from": "human", "value": "Count to three."}, {"from": "gpt", "value": "1 2 3"}]},
]
ULTRACHAT = [  # an ultrachat-style set: prompt, prompt_id, messages [{role, content}]; splits train_sft, test_sft
    {"prompt": "Say yes.", "prompt_id": "u1", "messages": [{"role": "user", "content": "Say yes."},
                                                          {"role": "assistant", "content": "Yes."}]},
    {"prompt": "Say no.", "prompt_id": "u2", "messages": [{"role": "user", "content": "Say no."},
                                                         {"role": "assistant", "content": "No."},
                                                         {"role": "user", "content": "Again."}]},
]


def write_hub_dataset(root: Path, configs: dict[str, dict[str, list[dict]]]) -> Path:
    """``root`` laid out as a hub dataset repository: ``<config>/<split>-00000-of-00001.parquet`` per configuration
    (``data/`` for the one called ``default``) and a README.md whose YAML header lists them."""
    card = ["---", "configs:"]
    for config, splits in configs.items():
        folder = "data" if config == "default" else config
        card += [f"- config_name: {config}", "  data_files:"]
        for split, rows in splits.items():
            (root / folder).mkdir(parents=True, exist_ok=True)
            Dataset.from_list(rows).to_parquet(str(root / folder / f"{split}-00000-of-00001.parquet"))
            card += [f"  - split: {split}", f"    path: {folder}/{split}-*"]
    (root / "README.md").write_text("\n".join([*card, "---", "", "# A test copy in the hub's layout", ""]))
    return root


def write_hub_copies(root: Path) -> dict[str, Path]:
    """Every preset's dataset, and two chat sets, in the hub's layout under ``root`` (one folder each)."""
    layouts = {
        "mt_bench": {"default": {"train": MT_BENCH}},
        "gsm8k": {"main": {"train": GSM8K[:1], "test": GSM8K}, "socratic": {"test": GSM8K[:1]}},
        "wmt14": {"de-en": {"train": WMT14[:1], "test": WMT14}},
        "cnn_dailymail": {"3.0.0": {"test": CNN_DAILYMAIL}},
        "nq_open": {"nq_open": {"train": NQ_OPEN[:1], "validation": NQ_OPEN}},
        "sharegpt": {"default": {"train": SHAREGPT}},
        "ultrachat": {"default": {"train_sft": ULTRACHAT[:1], "test_sft": ULTRACHAT}},
    }
    return {name: write_hub_dataset(root / name, configs) for name, configs in layouts.items()}
