"""Runs a ``draftretriever`` package in its own venv: the reference side of ``reference_rest.py``. Imports only numpy
and draftretriever, never specfamily; runs on Python 3.9 (REST's own wheel is cp39 only). Two packages share the
name: REST's own 0.1.0 (a suffix array; ``Writer(index_file_path=...)``) and the registry's 0.1.1 (ADED's tri-gram
table and tree search; ``Writer(file_path=...)``); both are driven the same way.

Reads a JSON job from the file given as the first argument: ``tokens`` (a .npy of token ids with -1 after each
sequence: our datastore's ``tokens.npy``, so both sides hold the same tokens), ``vocab_size``, ``choices``,
``k``, ``long``, ``min_span``, ``max_span``, ``repeats`` and ``prompts`` (each: ``ids``, its greedy continuation
``greedy`` and ``contexts``, the context lengths our run verified at). Prints one JSON object: for each repeat (a
fresh Reader: its search adds the query's 3-grams to its table, and its tree search draws from an unseeded
generator) and prompt, the passes of a greedy replay of REST's loop (:func:`replay`) and, at each of our contexts,
the paths the reference retrieved.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np


def write_index(tokens_file: str, vocab_size: int, path: str) -> int:
    """The reference datastore at ``path`` from the sequences of ``tokens_file``; returns how many were added."""
    import draftretriever

    tokens = np.load(tokens_file, mmap_mode="r")
    ends = np.flatnonzero(np.asarray(tokens) == -1)
    try:  # REST's own 0.1.0
        writer = draftretriever.Writer(index_file_path=path, vocab_size=vocab_size)
    except TypeError:  # ADED's 0.1.1
        writer = draftretriever.Writer(file_path=path, vocab_size=vocab_size)
    start = 0
    for end in ends.tolist():
        writer.add_entry(np.asarray(tokens[start:end]).tolist())
        start = end + 1
    writer.finalize()
    return len(ends)


def retrieve(reader, context: list[int], job: dict) -> list[list[int]]:
    """REST's retrieval step: the longest-first spans max_span..min_span of the context, the first that retrieves
    anything; its paths without the -2 padding."""
    for span in range(job["max_span"], job["min_span"] - 1, -1):
        query = context[-span:]
        if len(query) < max(2, span):
            continue
        paths = reader.search(query, k=job["k"], choices=job["choices"], long=job["long"])[0]
        if paths:
            return [[t for t in path if t != -2] for path in paths]
    return []


def accepted(paths: list[list[int]], truth: list[int], cap: int) -> int:
    """Greedy verification of the paths' trie: the longest path prefix equal to the greedy text (at most ``cap``)."""
    best = 0
    for path in paths:
        n = 0
        while n < min(len(path), len(truth), cap) and path[n] == truth[n]:
            n += 1
        best = max(best, n)
    return best


def replay(reader, prompt: dict, job: dict) -> int:
    """The passes REST's loop takes to produce ``greedy`` (one per retrieval: the accepted tokens plus one)."""
    greedy, done, passes = prompt["greedy"], 0, 0
    while done < len(greedy):
        paths = retrieve(reader, prompt["ids"] + greedy[:done], job)
        done += accepted(paths, greedy[done:], len(greedy) - done - 1) + 1
        passes += 1
    return passes


def main(path: str) -> None:
    import draftretriever

    job = json.loads(open(path).read())
    with tempfile.TemporaryDirectory() as folder:
        index = os.path.join(folder, "datastore.idx")
        sequences = write_index(job["tokens"], job["vocab_size"], index)
        repeats = []
        for _ in range(job["repeats"]):
            reader = draftretriever.Reader(index_file_path=index)
            rows = []
            for prompt in job["prompts"]:
                contexts = [retrieve(reader, prompt["ids"] + prompt["greedy"][:n], job) for n in prompt["contexts"]]
                rows.append({"passes": None, "paths": contexts})
            reader = draftretriever.Reader(index_file_path=index)  # the replay starts from an unchanged table
            for i, prompt in enumerate(job["prompts"]):  # (Python 3.9: no zip(strict=))
                rows[i]["passes"] = replay(reader, prompt, job)
            repeats.append(rows)
    from importlib.metadata import version as installed

    version = installed("draftretriever")
    print(json.dumps({"sequences": sequences, "repeats": repeats, "version": version}))


if __name__ == "__main__":
    main(sys.argv[1])
