"""Our suffix index against ArcticInference's suffix tree (``arctic_inference.suffix_decoding._C``), same history.

Both structures get the same token sequences (held-out zoo-corpus functions through a tokenizer, or random tokens);
then, at every ``--stride``-th position of a held-out sequence, both speculate from the same context with the same
options (tree mode, paper defaults) and the trees are compared: identical (same tokens, parents, order), identical
as sets of root-to-node paths, a tie (same size and score, other equal-probability nodes chosen: their heap is not
stable and their probabilities are float32), or different. Also printed: the time per speculation and the memory
per 1k tokens of each (ours measured with tracemalloc, also for the depth-64 suffix trie the index replaced;
theirs by its own estimate). Their speculate never matches the whole context it is given (match_len <
len(context)); ours is held to the same rule here (in the drafter it matters only for contexts shorter than
max_depth).

ArcticInference is optional (not a dependency). Its suffix-decoding extension builds with CMake and nanobind
alone (no vLLM, no CUDA): ``pip download --no-deps arctic-inference``, then build ``csrc/suffix_decoding`` and put
``_C*.so`` next to a copy of ``arctic_inference/suffix_decoding`` on ``PYTHONPATH`` (``--arctic-path``)::

    python benchmarks/suffix_peer.py --arctic-path /tmp/arctic/pkg
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from collections.abc import Sequence

from specfamily.drafters.suffix.automaton import Matcher, SuffixIndex
from specfamily.drafters.suffix.speculate import Limits, Speculation, best_match
from specfamily.drafters.suffix.tree import SuffixTrie


def paths(tokens: Sequence[int], parents: Sequence[int]) -> set[tuple[int, ...]]:
    """Every root-to-node path of a tree given as (tokens, parents)."""
    out, prefix = set(), []
    for token, parent in zip(tokens, parents, strict=True):
        path = (*(prefix[parent] if parent >= 0 else ()), token)
        prefix.append(path)
        out.add(path)
    return out


def ours(index: SuffixIndex, context: Sequence[int], limits: Limits, depth: int) -> Speculation:
    """Our speculation for ``context``, under their rule that a match is shorter than the context given."""
    matcher = Matcher(index)
    context = context[-index.max_depth :]
    matcher.extend(context)
    nodes = [n for n in matcher.suffix_nodes(depth) if index.depth_of(n) < len(context)]
    return best_match(index, nodes, depth, limits)


def traced_bytes(build) -> tuple[object, int]:
    """What ``build()`` returns and the bytes it left allocated (tracemalloc)."""
    tracemalloc.start()
    try:
        built = build()
        return built, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def build(cls, history: list[list[int]], max_depth: int):
    structure = cls(max_depth)
    for seq in history:
        structure.insert(seq)
    return structure


def compare(history: list[list[int]], queries: list[list[int]], stride: int, max_depth: int, arctic) -> dict:
    """Build both over ``history``; speculate at every ``stride``-th prefix of each query; count agreements."""
    limits = Limits(max_spec_factor=1.0, max_spec_offset=0.0, max_tree_size=32, min_token_prob=0.1)
    index, index_bytes = traced_bytes(lambda: build(SuffixIndex, history, max_depth))
    trie_bytes = traced_bytes(lambda: build(SuffixTrie, history, max_depth))[1]
    theirs = arctic.SuffixTree(max_depth)
    for seq_id, seq in enumerate(history):
        theirs.extend(seq_id, seq)
    counts = {"calls": 0, "proposed": 0, "identical": 0, "same_paths": 0, "tie": 0, "different": 0}
    our_seconds = their_seconds = 0.0
    for query in queries:
        for end in range(stride, len(query), stride):
            context = query[:end]
            t0 = time.perf_counter()
            mine = ours(index, context, limits, depth=10**6)
            t1 = time.perf_counter()
            draft = theirs.speculate(context[-max_depth:], 32, 1.0, 0.0, 0.1, True)
            their_seconds += time.perf_counter() - t1
            our_seconds += t1 - t0
            counts["calls"] += 1
            counts["proposed"] += bool(mine.tokens or draft.token_ids)
            if (mine.tokens, mine.parents) == (list(draft.token_ids), list(draft.parents)):
                counts["identical"] += 1
            elif paths(mine.tokens, mine.parents) == paths(draft.token_ids, draft.parents):
                counts["same_paths"] += 1
            elif abs(mine.score - draft.score) < 1e-5 and len(mine.tokens) == len(draft.token_ids):
                counts["tie"] += 1  # another choice among equal-probability nodes, same size and score
            else:
                counts["different"] += 1
    tokens = sum(len(s) for s in history)
    counts.update(ours_us=1e6 * our_seconds / counts["calls"], theirs_us=1e6 * their_seconds / counts["calls"],
                  ours_mb_per_1k=index_bytes / tokens / 1000, trie_mb_per_1k=trie_bytes / tokens / 1000,
                  theirs_mb_per_1k=theirs.estimate_memory() / tokens / 1000,
                  history_tokens=tokens)
    return counts


def corpus_sequences(count: int, tokenizer_name: str | None) -> list[list[int]]:
    """Held-out zoo-corpus functions as token ids (the zoo code tokenizer, or bytes without one)."""
    from specfamily.recipes.repeated import heldout_functions

    texts = heldout_functions(limit=count)
    if tokenizer_name is None:
        return [list(text.encode()) for text in texts]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def main(argv: Sequence[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arctic-path", default=None, help="a folder holding arctic_inference/suffix_decoding")
    parser.add_argument("--sequences", type=int, default=48, help="held-out functions: 3/4 history, 1/4 queries")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: bytes)")
    parser.add_argument("--random", action="store_true", help="random tokens over a vocabulary of 6 instead")
    parser.add_argument("--stride", type=int, default=3)
    parser.add_argument("--max-depth", type=int, default=64)
    args = parser.parse_args(argv)
    if args.arctic_path:
        sys.path.insert(0, args.arctic_path)
    try:
        from arctic_inference.suffix_decoding import _C as arctic
    except ImportError as err:
        print(f"ArcticInference's suffix decoding is not importable here ({err}); see this script's docstring")
        return None
    if args.random:
        rng = random.Random(0)
        sequences = [[rng.randrange(6) for _ in range(rng.randint(20, 200))] for _ in range(args.sequences)]
    else:
        sequences = corpus_sequences(args.sequences, args.tokenizer)
    split = len(sequences) * 3 // 4
    result = compare(sequences[:split], sequences[split:], args.stride, args.max_depth, arctic)
    print(result)
    return result


if __name__ == "__main__":
    main()
