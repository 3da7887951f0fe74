"""Reading self-distillation data (``distill.py``'s batch files): conversations, their features, training windows.
Repeats of a user turn are kept once (the first); held-out conversations are chosen by a hash of the user turn;
windows never cross a conversation's boundary.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

HELDOUT_PERCENT = 2.0


@dataclass
class Conversations:
    """Conversations back to back: ``features`` has one row per token but each conversation's last."""

    tokens: torch.Tensor  # (T,) long
    features: torch.Tensor  # (T - C, H)
    starts: torch.Tensor  # (C + 1,) long offsets into tokens
    answer_starts: torch.Tensor  # (C,) long, relative to each conversation
    turns: list[str]

    def __len__(self) -> int:
        return len(self.turns)

    @property
    def lengths(self) -> torch.Tensor:
        return self.starts[1:] - self.starts[:-1]

    def conversation(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (n,) and features (n - 1, H) of conversation i."""
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        return self.tokens[a:b], self.features[a - i : b - i - 1]

    def prompt(self, i: int) -> list[int]:
        """The chat prompt of conversation i (everything before its answer)."""
        a = int(self.starts[i])
        return self.tokens[a : a + int(self.answer_starts[i])].tolist()

    def answer_tokens(self) -> torch.Tensor:
        """Every answer token, concatenated (what a draft head is asked to predict)."""
        parts = [self.tokens[int(s) + int(a) : int(e)]
                 for s, e, a in zip(self.starts[:-1], self.starts[1:], self.answer_starts, strict=True)]
        return torch.cat(parts) if parts else self.tokens[:0]


def is_heldout(turn: str, percent: float = HELDOUT_PERCENT) -> bool:
    return int(hashlib.sha1(turn.encode()).hexdigest()[:8], 16) % 10000 < percent * 100


def load_distilled(folder: str | Path, percent: float = HELDOUT_PERCENT) -> tuple[Conversations, Conversations]:
    """(train, held-out) conversations of every batch in ``folder``, exact repeats of a turn dropped."""
    seen: set[str] = set()
    parts: dict[bool, list] = {False: [], True: []}
    files = sorted(Path(folder).glob("batch-*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no distillation batches in {str(folder)!r}; make them with `specfamily-zoo distill "
                                f"--out {folder}`")
    for path in files:
        with safe_open(str(path), "pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open has no iterator)
            turns = json.loads(handle.metadata()["user_turns"])
        starts = tensors["starts"]
        for i, turn in enumerate(turns):
            if turn in seen:
                continue
            seen.add(turn)
            a, b = int(starts[i]), int(starts[i + 1])
            features = tensors["features"][a - i : b - i - 1]
            parts[is_heldout(turn, percent)].append((tensors["tokens"][a:b].long(), features,
                                                     int(tensors["answer_starts"][i]), turn))
    return _join(parts[False]), _join(parts[True])


def load_for_target(folder: str | Path, target, percent: float = HELDOUT_PERCENT) -> tuple[Conversations,
                                                                                        Conversations]:
    """:func:`load_distilled`, refusing data with no training or held-out conversation or from another target."""
    train, heldout = load_distilled(folder, percent)
    if not len(train) or not len(heldout):
        raise ValueError(f"{folder}: {len(train)} training and {len(heldout)} held-out conversations; "
                         "distil more batches")
    if train.features.shape[-1] != target.hidden_size or int(train.tokens.max()) >= target.vocab_size:
        raise ValueError(f"{folder} was not distilled from this target (feature width "
                         f"{train.features.shape[-1]}, largest token id {int(train.tokens.max())})")
    return train, heldout


def _join(items: list) -> Conversations:
    if not items:
        return Conversations(torch.zeros(0, dtype=torch.long), torch.zeros(0, 0), torch.zeros(1, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), [])
    lengths = torch.tensor([tokens.numel() for tokens, *_ in items])
    return Conversations(torch.cat([t for t, *_ in items]), torch.cat([f for _, f, *_ in items]),
                         torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0))),
                         torch.tensor([a for *_, a, _ in items], dtype=torch.long), [turn for *_, turn in items])


@dataclass
class WindowSampler:
    """Uniform windows of ``length`` tokens, each with the features of its positions, inside one conversation."""

    data: Conversations
    length: int

    def __post_init__(self) -> None:
        lengths = self.data.lengths
        fits = lengths - self.length  # window starts 0 .. n - 1 - length keep a feature for every position
        convs = torch.nonzero(fits > 0).squeeze(1)
        if convs.numel() == 0:
            raise ValueError(f"no conversation is longer than {self.length} tokens")
        self.token_start = torch.cat([self.data.starts[i] + torch.arange(int(fits[i])) for i in convs.tolist()])
        self.conv = torch.repeat_interleave(convs, fits[convs])

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (batch, length) long and features (batch, length, H) float32."""
        pick = torch.randint(0, self.token_start.numel(), (batch,), generator=generator)
        return self.windows(self.token_start[pick], self.conv[pick])

    def fixed(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` evenly spread windows (evaluation)."""
        pick = torch.linspace(0, self.token_start.numel() - 1, count).long()
        return self.windows(self.token_start[pick], self.conv[pick])

    def windows(self, token_start: torch.Tensor, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = torch.arange(self.length)
        token_index = token_start[:, None] + offsets
        tokens = self.data.tokens[token_index]
        features = self.data.features[token_index - conv[:, None]].float()
        return tokens, features
