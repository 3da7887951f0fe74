"""Every registered drafter as a test on a tiny random target builds it: at a constant draft length, so it drafts on
every pass it can (random weights where it needs trained ones, a datastore of the test's own prompts for REST).
Used by the CUDA tests (tests/gpu) and ``benchmarks/batch_syncs.py``; a recipe, above the drafters, as it builds
REST's datastore. ``covered`` says whether a registered drafter is missing from the table."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Sequence

import specfamily as sf
from specfamily.core.drafter import Drafter
from specfamily.core.target import Target
from specfamily.testing.conformance import draft_model_for

Factory = Callable[[Target], Drafter | None]


def every_drafter(prompts: Sequence[Sequence[int]]) -> dict[str, Factory]:
    """name -> factory(target), plain decoding first (None); ``prompts``: the ones REST's datastore is built from,
    each followed by the next (as tests/testing/test_greedy.py's)."""
    return {
        "plain": lambda t: None,
        "small_model": lambda t: sf.create_drafter("small_model", t, model=draft_model_for(t).to(t.device), gamma=4),
        "prompt_lookup": lambda t: sf.create_drafter("prompt_lookup", t, gamma=4, branches=2),
        "self_spec": lambda t: sf.create_drafter("self_spec", t, skip=["mlp:1"], gamma=4),
        "medusa": lambda t: sf.create_drafter("medusa", t, weights="random", gamma=3),
        "hydra": lambda t: sf.create_drafter("hydra", t, weights="random", gamma=3),
        "eagle": lambda t: sf.create_drafter("eagle", t, weights="random", gamma=3),
        "eagle3": lambda t: sf.create_drafter("eagle3", t, weights="random", gamma=3),
        "suffix": lambda t: sf.create_drafter("suffix", t, gamma=4, max_spec_offset=2),
        "recycling": lambda t: sf.create_drafter("recycling", t, gamma=3, template="2.2.2"),
        "rest": lambda t: sf.create_drafter("rest", t, gamma=4, datastore=rest_datastore(
            t.vocab_size, tuple(tuple(p) for p in prompts))),
        "merge": lambda t: sf.create_drafter("merge", t, parts=["prompt_lookup", "eagle3"], gamma=3,
                                             options={"eagle3": {"weights": "random"}}),
        "lookahead": lambda t: sf.create_drafter("lookahead", t, gamma=3, guesses=3, window=4, ngram=4),
    }


def covered(table: dict[str, Factory]) -> set[str]:
    """The registered drafters the table leaves out (empty: every one is in it)."""
    return set(sf.list_drafters()) - set(table)


@functools.cache
def rest_datastore(vocab_size: int, prompts: tuple[tuple[int, ...], ...]) -> str:
    """A REST datastore (a temporary folder, once per process) of ``prompts``, each followed by the next."""
    from specfamily.drafters.rest.datastore import build_datastore

    sequences = [list(a) + list(b) for a, b in zip(prompts, prompts[1:] + prompts[:1], strict=True)]
    return str(build_datastore(sequences, tempfile.mkdtemp(prefix="rest-"), vocab_size, progress=False))
