"""Logits processors a model's generation config sets: the context-dependent ones ``generate()`` applies, applied
here to every verified row with that row's own context; the others refused by name.

transformers' ``generate()`` builds logits processors from ``model.generation_config`` and runs them on the scores
before the sampling warp. specfamily applies the common ones the same way (``SUPPORTED``): the verifier's p at
row 0 (the root) sees the committed context, at row i + 1 the committed context plus the path from the root to
draft node i. With none of them set nothing changes: :func:`processors_for` returns None and the loop never calls
into this module. The rest (bad words, sequence bias, forced tokens, length decay, guidance, watermarks,
constraints) are refused at load, each named.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

# Logits processors transformers' generate() builds from a model's generation config, with the values at which
# each one acts (as in GenerationMixin._get_logits_processor, transformers 5.24, where every default is None).
# Sampling settings (temperature, top_k, top_p, min_p, typical_p, epsilon/eta cutoffs, do_sample) are not
# processors here: specfamily takes its sampling explicitly (SamplingConfig) and greedy decoding ignores them.
_PROCESSORS = {
    "repetition_penalty": lambda v: v != 1.0,
    "no_repeat_ngram_size": lambda v: v > 0,
    "bad_words_ids": lambda v: len(v) > 0,
    "suppress_tokens": lambda v: len(v) > 0,
    "begin_suppress_tokens": lambda v: len(v) > 0,
    "sequence_bias": lambda v: len(v) > 0,
    "min_length": lambda v: v > 0,
    "min_new_tokens": lambda v: v > 0,
    "forced_bos_token_id": lambda v: True,
    "forced_eos_token_id": lambda v: True,
    "exponential_decay_length_penalty": lambda v: True,
    "guidance_scale": lambda v: v != 1,
    "watermarking_config": lambda v: True,
    "force_words_ids": lambda v: len(v) > 0,
    "constraints": lambda v: len(v) > 0,
}
SUPPORTED = ("repetition_penalty", "no_repeat_ngram_size", "suppress_tokens", "begin_suppress_tokens", "min_length",
             "min_new_tokens")


def active_logits_processors(generation_config) -> list[str]:
    """The logits-processor settings of a GenerationConfig that would change generate()'s scores, by name."""
    if generation_config is None:
        return []
    return [name for name, acts in _PROCESSORS.items()
            if (value := getattr(generation_config, name, None)) is not None and acts(value)]


def check_generation_config(model: PreTrainedModel) -> None:
    """Refuse a model whose generation config sets a logits processor specfamily does not apply, in one line."""
    check_processors(getattr(model, "generation_config", None), type(model).__name__)


def check_processors(generation_config, owner: str = "the model") -> None:
    """Refuse a generation config with a processor outside ``SUPPORTED`` (or a repetition penalty <= 0)."""
    unsupported = [name for name in active_logits_processors(generation_config) if name not in SUPPORTED]
    if unsupported:
        settings = ", ".join(f"{name}={getattr(generation_config, name)!r}" for name in unsupported)
        raise ValueError(
            f"{owner}'s generation_config sets {settings}, a logits processor specfamily does not apply (it "
            f"applies {', '.join(SUPPORTED)} as generate() does): reset it on the model "
            f"(model.generation_config.{unsupported[0]} = None) and pass the model to load_target"
        )
    penalty = getattr(generation_config, "repetition_penalty", None)
    if penalty is not None and not (isinstance(penalty, (int, float)) and penalty > 0):
        raise ValueError(f"{owner}'s generation_config sets repetition_penalty={penalty!r}; it must be a number > 0")


@dataclass(frozen=True)
class Processors:
    """The supported processors a generation config sets, with the values at which they act (neutral: off).
    ``eos_token_ids`` are what the minimum lengths hold back; without them those two do nothing, as in generate()."""

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    min_length: int = 0
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()

    def start(self, prompt: list[int], vocab_size: int, device: torch.device) -> ProcessorState:
        """The state of one request over ``prompt`` (the committed context before its first pass)."""
        return ProcessorState(self, len(prompt), vocab_size, device)


def processors_for(generation_config, eos_token_ids: tuple[int, ...], vocab_size: int) -> Processors | None:
    """The supported processors ``generation_config`` sets (ids outside the vocabulary dropped), or None when none
    would change a score: the loop then applies nothing at all."""
    active = set(active_logits_processors(generation_config))
    if not active:
        return None
    check_processors(generation_config)  # the config may have changed since the model was loaded
    value = lambda name, neutral: getattr(generation_config, name) if name in active else neutral  # noqa: E731
    in_vocab = lambda ids: tuple(sorted({int(i) for i in ids if 0 <= int(i) < vocab_size}))  # noqa: E731
    eos = eos_token_ids if active & {"min_length", "min_new_tokens"} else ()
    processors = Processors(
        repetition_penalty=float(value("repetition_penalty", 1.0)),
        no_repeat_ngram_size=int(value("no_repeat_ngram_size", 0)),
        suppress_tokens=in_vocab(value("suppress_tokens", ())),
        begin_suppress_tokens=in_vocab(value("begin_suppress_tokens", ())),
        min_length=int(value("min_length", 0)) if eos else 0,
        min_new_tokens=int(value("min_new_tokens", 0)) if eos else 0,
        eos_token_ids=tuple(eos),
    )
    return None if processors == Processors(eos_token_ids=processors.eos_token_ids) else processors


def draft_paths(parents: list[int]) -> list[list[int]]:
    """The draft nodes on the path to each verified row: row 0 (the root) none, row i + 1 the root's child down
    to node i (parents[i] < i, so a parent's path is known before its children's)."""
    paths: list[list[int]] = [[]]
    for node, parent in enumerate(parents):
        paths.append([*paths[parent + 1], node])
    return paths


class ProcessorState:
    """One request's context as the processors read it, kept as tokens are committed (never recomputed over the
    whole context): which tokens occurred (repetition penalty) and every n-gram seen (n-gram blocking)."""

    def __init__(self, processors: Processors, prompt_length: int, vocab_size: int, device: torch.device) -> None:
        self.processors, self.prompt_length, self.device = processors, prompt_length, device
        self.committed: list[int] = []  # the committed context, as far as seen
        self.present: set[int] = set()  # the distinct committed tokens ...
        self.present_ids = torch.zeros(0, dtype=torch.long, device=device)  # ... (k,), in order of appearance
        self.ngrams: dict[tuple[int, ...], set[int]] = {}  # (n - 1)-gram -> the tokens that followed it
        self.suppressed = torch.tensor(processors.suppress_tokens, dtype=torch.long, device=device)

    def update(self, tokens: list[int]) -> None:
        """Take in the tokens committed since the last call (``tokens`` is the whole committed context)."""
        seen, new = len(self.committed), tokens[len(self.committed):]
        if not new:
            return
        self.committed.extend(new)
        if self.processors.repetition_penalty != 1.0:
            fresh = [token for token in dict.fromkeys(new) if token not in self.present]
            self.present.update(fresh)
            if fresh:
                self.present_ids = torch.cat([self.present_ids, torch.tensor(fresh).to(self.device)])
        size = self.processors.no_repeat_ngram_size
        for t in range(max(seen, size - 1), len(self.committed)) if size else ():
            self.ngrams.setdefault(tuple(self.committed[t - size + 1:t]), set()).add(self.committed[t])

    def apply(self, tokens: list[int], draft_tokens: torch.Tensor, parents: torch.Tensor,
              logits: torch.Tensor) -> torch.Tensor:
        """(n + 1, V) scores after the processors, row r with its own context: ``tokens`` (the committed context)
        plus the draft tokens on the path to row r. In at least float32, as generate() processes its scores."""
        self.update(tokens)
        draft = draft_tokens.tolist()
        paths = [[draft[j] for j in nodes] for nodes in draft_paths(parents.tolist())]
        scores = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)  # (n + 1, V)
        if self.processors.repetition_penalty != 1.0:
            self._penalise(scores, paths)
        if self.suppressed.numel():
            scores[:, self.suppressed] = float("-inf")
        banned = self._banned(paths)
        if banned:
            index = torch.tensor(banned, dtype=torch.long).to(scores.device).T  # (2, bans): rows, tokens
            scores[index[0], index[1]] = float("-inf")
        return scores

    def _penalise(self, scores: torch.Tensor, paths: list[list[int]]) -> None:
        """Repetition penalty, in place: a token present in the row's context (prompt included) has its score
        divided by the penalty when positive, multiplied by it when negative, once however often it occurred
        (RepetitionPenaltyLogitsProcessor). Only the k committed tokens' columns and the path tokens are read."""
        penalty = self.processors.repetition_penalty
        if self.present_ids.numel():  # in every row's context
            scores.index_copy_(1, self.present_ids, _penalised(scores.index_select(1, self.present_ids), penalty))
        pairs = [(row, token) for row, path in enumerate(paths) for token in dict.fromkeys(path)
                 if token not in self.present]
        if pairs:
            index = torch.tensor(pairs, dtype=torch.long).to(scores.device).T  # (2, pairs): rows, tokens
            scores[index[0], index[1]] = _penalised(scores[index[0], index[1]], penalty)

    def _banned(self, paths: list[list[int]]) -> list[tuple[int, int]]:
        """(row, token) pairs whose score becomes -inf: n-gram blocking, suppressed first tokens, end-of-sequence
        before the minimum lengths (the tokens suppressed everywhere are masked by column)."""
        proc, length = self.processors, len(self.committed)
        banned: list[tuple[int, int]] = []
        for row, path in enumerate(paths):
            total = length + len(path)  # the row's context length, as generate()'s input_ids
            blocked = list(self._ngram_bans(path)) if proc.no_repeat_ngram_size else []
            if total == self.prompt_length:
                blocked += proc.begin_suppress_tokens
            if total < proc.min_length or total - self.prompt_length < proc.min_new_tokens:
                blocked += proc.eos_token_ids
            banned += [(row, token) for token in blocked]
        return banned

    def _ngram_bans(self, path: list[int]) -> set[int]:
        """Tokens that would complete an n-gram already in the row's context (NoRepeatNGramLogitsProcessor): the
        committed context's n-grams from the table, those ending in the path scanned here."""
        size = self.processors.no_repeat_ngram_size
        if len(self.committed) + len(path) < size:
            return set()
        local = self.committed[max(0, len(self.committed) - (size - 1)):] + path  # the windows that end in the path
        prefix = local[len(local) - (size - 1):]
        banned = set(self.ngrams.get(tuple(prefix), ()))
        for end in range(max(size - 1, len(local) - len(path)), len(local)):
            if local[end - size + 1:end] == prefix:
                banned.add(local[end])
        return banned


def _penalised(scores: torch.Tensor, penalty: float) -> torch.Tensor:
    return torch.where(scores < 0, scores * penalty, scores / penalty)
