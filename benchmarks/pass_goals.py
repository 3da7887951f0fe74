"""Issue 32's goals measured in one run: SmolLM2, the stream kernel, Spec-Bench's first turns and code prompts.

For each prompt set (``--per-category`` Spec-Bench questions of each category through the chat template, as the
default run builds them; ``--code`` prompts of ``zoo:complete``), each prompt is prefilled and decoded greedily; at
every ``--every``-th new token the script times, interleaved and rotated, ``--repeats`` passes of each arm over that
cache (then rolled back): forward + verification + commit, the loop's three steps. Clock (``--clock auto``): this
process's CPU time on one thread (steadier on a shared machine), the wall clock on more (CPU time would add the
threads up); the floor's bandwidth is the faster of two probes (a torch sum and the stream kernel's one-row product)
over a working set the size of the weights (``--gb``), each best-of on the wall clock (``benchmarks/bandwidth.py``).

- arms: ``plain`` (the root alone), ``chain`` (root + ``--nodes`` draft tokens, the commit keeps half: a crop) and
  ``tree`` (root + ``--nodes`` nodes in two branches, the commit keeps the second: a cache rewrite), each verified
  greedy and sampled (``sampling=chat``: printed). The draft tokens are the target's own greedy continuation (the
  tree's other branch: later tokens), q = None: the deterministic drafts of the default run's lookup, suffix, Medusa
  and EAGLE trees. Greedy and sampled arms feed the same rows and commit the same path (the goals' "same shape").
- goal 1: the plain pass over its floor, (weights + the KV cache it reads) / the measured read bandwidth;
- goal 2: the drafted greedy passes over the plain one (sums over the same caches);
- goal 3: plain decoding sampled over greedy, ms per token (``sf.generate``, ``--decode-tokens`` each, the prefill
  included as a run counts it, arms interleaved prompt by prompt), and each sampled pass (plain, chain, tree) over its
  greedy twin over the same caches;
- for every miss, its arms split into parts measured in the same run: the products (every linear weight once, for
  that many rows, timed alone), attention (the torch profiler's, at the set's median cache length), verification
  (host: timed inside the pass) and the rest (norms, rope, mask, cache, Python: what is left);
- ``--greedy-run DIR --sampled-run DIR``: the issue's run goals checked on two CLI run folders (``pass_goals_runs``).

    python benchmarks/pass_goals.py --threads 2 --json docs/pass-goals.json
    python benchmarks/pass_goals.py --threads 2 --greedy-run work/default-run --sampled-run work/sampled-run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from bandwidth import floor_bandwidth, probe_text
from common import make_clock, median_time, set_threads, spec_bench_prompts, write_json
from pass_cost import Shapes, profile, weight_bytes
from pass_goals_runs import Goal, goals_table, run_goals

from specfamily.core.acceptance import verify_draft
from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft, SamplingConfig
from specfamily.runtime.matmul import linear_for

KINDS = ("plain", "chain", "tree")
STEPS = ("forward", "verify", "commit")
CHAT = SamplingConfig(temperature=0.7, top_k=0, top_p=0.9)  # configs/sampling/chat.yaml (checked by the tests)
GREEDY = SamplingConfig()


@dataclass
class Arms:
    """Per arm ("chain sampled", ...): per timed cache, the median seconds of each step of the pass."""

    lengths: list[int] = field(default_factory=list)
    steps: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, length: int, medians: dict[str, dict[str, float]]) -> None:
        self.lengths.append(length)
        for arm, by_step in medians.items():
            for step, seconds in by_step.items():
                self.steps.setdefault(arm, {}).setdefault(step, []).append(seconds)

    def total(self, arm: str, step: str | None = None) -> float:
        """Summed seconds over every timed cache: the whole pass, or one of its steps."""
        return sum(sum(self.steps[arm][s]) for s in ((step,) if step else STEPS))

    def per_pass(self, arm: str, step: str | None = None) -> float:
        return self.total(arm, step) / len(self.lengths)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream", help="the lean forward's matmul kind (the default run's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-category", type=int, default=1, help="Spec-Bench questions per category (0: none)")
    parser.add_argument("--code", type=int, default=4, help="zoo:complete prompts (0: none)")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens decoded after each prompt")
    parser.add_argument("--every", type=int, default=32, help="time the passes at every this many new tokens")
    parser.add_argument("--nodes", type=int, default=4, help="draft tokens fed with the root")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per arm and cache (median)")
    parser.add_argument("--decode-tokens", type=int, default=48, help="new tokens a prompt, plain decoding ms/token")
    parser.add_argument("--decode-rounds", type=int, default=2, help="rounds of plain decoding, greedy and sampled")
    parser.add_argument("--profile-passes", type=int, default=10, help="profiled passes per arm of a miss")
    parser.add_argument("--gb", type=float, default=None,
                        help="the bandwidth probes' working set, GB; default: the bytes of the target's weights")
    parser.add_argument("--bandwidth-repeats", type=int, default=20, help="the probe's best of this many reads")
    parser.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto",
                        help="auto: process CPU time on one thread, the wall clock on more")
    parser.add_argument("--greedy-run", default=None, help="a CLI run folder at temperature 0")
    parser.add_argument("--sampled-run", default=None, help="a CLI run folder at t0.7 / top-p 0.9")
    parser.add_argument("--json", default=None, help="also write everything measured here")
    return parser.parse_args(argv)


def prompt_sets(target: Target, args: argparse.Namespace) -> dict[str, list[list[int]]]:
    """name -> prompts: Spec-Bench's first turns through the chat template, and zoo:complete's code prompts."""
    from specfamily.eval.datasets import DatasetSpec, load_prompts

    sets = {}
    if args.per_category:
        sets["spec_bench"] = spec_bench_prompts(args.per_category, target.tokenizer)[0]
    if args.code:
        spec = DatasetSpec(name="complete", path="zoo:complete", field="prompt", id_field="id",
                           add_special_tokens=False, num_examples=args.code, select="spread")
        sets["complete"] = [p.ids for p in load_prompts(spec, target.tokenizer)]
    if not sets:
        raise SystemExit("no prompts: set --per-category or --code")
    return sets


def drafts(sequence: list[int], length: int, shapes: Shapes, vocab: int) -> tuple[torch.Tensor, dict[str, Draft]]:
    """(root (1,), kind -> draft) at a cache of ``length`` tokens of ``sequence`` (a prompt and its greedy
    continuation): the chain is the next tokens; the tree's second branch too (greedy verification takes it: the
    commit rewrites), its first branch starts with another token than the next one."""
    ahead = torch.tensor(sequence[length : length + shapes.nodes + 1])
    chain = ahead[1:]
    tree = torch.empty(shapes.nodes, dtype=torch.long)
    tree[1::2] = chain[: len(tree[1::2])]
    tree[0::2] = chain[: len(tree[0::2])]
    tree[0] = (chain[0] + 1) % vocab
    return ahead[:1], {"plain": Draft.empty(), "chain": Draft.chain(chain),
                       "tree": Draft(tree, torch.tensor(shapes.tree_parents))}


def kept_path(kind: str, shapes: Shapes) -> list[int]:
    return [] if kind == "plain" else shapes.chain_path if kind == "chain" else shapes.tree_path


def timed_pass(target: Target, root: torch.Tensor, draft: Draft, path: list[int], sampling: SamplingConfig,
               seed: int, clock: Callable[[], float]) -> dict[str, float]:
    """Seconds of each step of one pass (forward, verification, commit of ``path``), then rolled back."""
    length = target.cached_length
    start = clock()
    out = target.forward(root, draft)
    forwarded = clock()
    verify_draft(draft, out.logits, sampling, torch.Generator().manual_seed(seed))
    verified = clock()
    target.commit(path)
    done = clock()
    target.rollback(length)
    return {"forward": forwarded - start, "verify": verified - forwarded, "commit": done - verified}


def time_cache(target: Target, sequence: list[int], shapes: Shapes, repeats: int,
               clock: Callable[[], float]) -> dict[str, dict[str, float]]:
    """arm -> step -> median seconds over ``repeats`` passes at the target's cache (after a warm-up round), the
    arms rotated round by round."""
    root, by_kind = drafts(sequence, target.cached_length, shapes, target.vocab_size)
    arms = [(kind, name, sampling) for kind in KINDS for name, sampling in (("greedy", GREEDY), ("sampled", CHAT))]
    times: dict[str, dict[str, list[float]]] = {f"{k} {n}": {s: [] for s in STEPS} for k, n, _ in arms}
    for round_ in range(repeats + 1):
        shift = round_ % len(arms)
        for kind, name, sampling in arms[shift:] + arms[:shift]:
            steps = timed_pass(target, root, by_kind[kind], kept_path(kind, shapes), sampling, round_, clock)
            if round_:
                for step, seconds in steps.items():
                    times[f"{kind} {name}"][step].append(seconds)
    return {arm: {step: statistics.median(v) for step, v in by_step.items()} for arm, by_step in times.items()}


@torch.inference_mode()
def measure_prompt(target: Target, prompt: list[int], args: argparse.Namespace, shapes: Shapes, arms: Arms) -> None:
    """Prefill ``prompt``, decode it greedily, and time every arm at every ``--every``-th new token's cache."""
    import specfamily as sf

    continuation = sf.generate(target, None, prompt, max_new_tokens=args.new_tokens + shapes.nodes + 1).tokens
    sequence = prompt + continuation
    target.reset()
    target.forward(torch.tensor(prompt[:-1]))
    target.commit([])
    for offset in range(0, args.new_tokens, args.every):
        length = len(prompt) - 1 + offset
        if length + shapes.nodes + 1 > len(sequence):
            break  # the text ended (EOS) before this cache
        if target.cached_length < length:
            target.forward(torch.tensor(sequence[target.cached_length : length]))
            target.commit([])
        arms.add(length, time_cache(target, sequence, shapes, args.repeats, args.timer))


def kv_bytes(target: Target, length: int) -> int:
    """Bytes of keys and values a pass over ``length`` cached tokens reads (every layer)."""
    config = target.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    element = next(target.model.parameters()).element_size()
    return 2 * config.num_hidden_layers * heads * head_dim * length * element


def decode_ms(target: Target, prompts: list[list[int]], tokens: int, rounds: int,
              clock: Callable[[], float]) -> dict[str, float]:
    """Plain decoding's ms per new token, greedy and sampled (chat), interleaved prompt by prompt."""
    import specfamily as sf

    seconds, made = {"greedy": 0.0, "sampled": 0.0}, {"greedy": 0, "sampled": 0}
    for round_ in range(rounds):
        for seed, prompt in enumerate(prompts):
            order = (("greedy", GREEDY), ("sampled", CHAT))
            for name, sampling in order if (round_ + seed) % 2 == 0 else order[::-1]:
                start = clock()
                out = sf.generate(target, None, prompt, max_new_tokens=tokens, sampling=sampling, seed=seed)
                seconds[name] += clock() - start
                made[name] += len(out.tokens)
    return {name: 1e3 * seconds[name] / made[name] for name in seconds}


def set_goals(name: str, arms: Arms, floor: dict[str, float], decode: dict[str, float]) -> list[Goal]:
    """Goals 1-3 of one prompt set; ``floor``: seconds summed over its timed caches, reading the weights and the
    KV cache at the measured bandwidth."""
    plain = arms.total("plain greedy")
    passes = len(arms.lengths)
    note = (f"floor {(floor['weights'] + floor['kv']) / passes * 1e3:.2f} ms a pass: weights "
            f"{floor['weights'] / passes * 1e3:.2f} + KV cache {floor['kv'] / passes * 1e3:.2f}; "
            f"over the weights alone {plain / floor['weights']:.3f}")
    measured = plain >= floor["weights"]  # else the probe read slower than the pass (a loaded thread): no floor
    if not measured:
        note += "; the pass read the weights faster than the probe: no floor measured on this machine"
    goals = [Goal(f"{name}: plain pass / floor", plain / (floor["weights"] + floor["kv"]), 1.2, ("plain greedy",),
                  note=note, measured=measured)]
    for kind in ("chain", "tree"):
        goals.append(Goal(f"{name}: {kind} pass / plain pass (greedy)", arms.total(f"{kind} greedy") / plain, 1.10,
                          (f"{kind} greedy", "plain greedy")))
    goals.append(Goal(f"{name}: plain decoding sampled / greedy (ms/token)", decode["sampled"] / decode["greedy"],
                      1.05, ("plain sampled", "plain greedy")))
    for kind in KINDS:  # the plain pass too: decoding's ms/token above carries each prompt's prefill
        goals.append(Goal(f"{name}: {kind} pass sampled / greedy", arms.total(f"{kind} sampled")
                          / arms.total(f"{kind} greedy"), 1.05, (f"{kind} sampled", f"{kind} greedy")))
    return goals


@torch.inference_mode()
def products(target: Target, rows: int, repeats: int, clock: Callable[[], float]) -> float:
    """Median seconds of ``rows`` rows through every linear weight once (the tied head once), with the lean
    forward's kind of product: ``pass_cost.products`` on ``clock`` (its own is CPU time, which adds threads up)."""
    linear = linear_for(target.matmul)
    weights = {id(m.weight): m.weight for m in target.model.modules() if isinstance(m, torch.nn.Linear)}.values()
    inputs = {w.shape[1]: torch.randn(1, rows, w.shape[1]) for w in weights}

    def every_weight() -> None:
        for weight in weights:
            linear(inputs[weight.shape[1]], weight, None)

    every_weight()  # warm-up
    return median_time(every_weight, repeats, clock)


def parts(arms: Arms, arm: str, attention_share: dict[str, float], alone: dict[int, float]) -> dict[str, float]:
    """ms per pass of ``arm``: products (timed alone, that many rows), attention (the profiler's share of a profiled
    forward of that kind, times this arm's timed forward), verification (host, timed in the pass), the rest."""
    kind = arm.split()[0]
    whole, product = arms.per_pass(arm) * 1e3, alone[1 if kind == "plain" else max(alone)] * 1e3
    verify = arms.per_pass(arm, "verify") * 1e3
    attention = attention_share[kind] * arms.per_pass(arm, "forward") * 1e3
    return {"pass": whole, "products": product, "attention": attention, "verification": verify,
            "rest": whole - product - attention - verify}


def attention_share(target: Target, shapes: Shapes, kind: str, length: int, passes: int) -> float:
    """The torch profiler's attention time over the whole profiled pass (forward + commit) of ``kind``."""
    sections = profile(target, shapes, kind, length, passes)[0]
    return sections.get("attention", 0.0) / sum(sections.values())


def split_misses(target: Target, goals: list[Goal], all_arms: dict[str, Arms], args: argparse.Namespace,
                 shapes: Shapes) -> dict[str, dict[str, dict[str, float]]]:
    """set -> arm -> parts, for every arm a missed goal names (profiled at the set's median cache length)."""
    alone = {rows: products(target, rows, args.repeats, args.timer) for rows in (1, shapes.nodes + 1)}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, arms in all_arms.items():
        named = {arm for g in goals if g.measured and not g.met and g.name.startswith(name + ":") for arm in g.arms}
        if not named:
            continue
        length = int(statistics.median(arms.lengths))
        share = {kind: attention_share(target, shapes, kind, length, args.profile_passes)
                 for kind in {arm.split()[0] for arm in named}}
        out[name] = {arm: parts(arms, arm, share, alone) for arm in sorted(named)}
    return out


def parts_table(split: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["| set | arm | pass ms | products ms | attention ms | verification ms | rest ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, by_arm in split.items():
        for arm, p in by_arm.items():
            lines.append(f"| {name} | {arm} | {p['pass']:.2f} | {p['products']:.2f} | {p['attention']:.2f} "
                         f"| {p['verification']:.2f} | {p['rest']:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    args.clock = args.clock if args.clock != "auto" else "cpu" if args.threads == 1 else "wall"
    args.timer = make_clock(args.clock)
    started = time.perf_counter()
    target = load_target(args.model, device="cpu", matmul=args.matmul)
    shapes, sets = Shapes(args.nodes), prompt_sets(target, args)
    gb = weight_bytes(target) / 1e9 if args.gb is None else args.gb
    bandwidth, probes = floor_bandwidth(gb, args.bandwidth_repeats)
    all_arms = {name: Arms() for name in sets}
    for name, prompts in sets.items():
        for number, prompt in enumerate(prompts, 1):
            measure_prompt(target, prompt, args, shapes, all_arms[name])
            print(f"{name} {number}/{len(prompts)}: {len(prompt)} prompt tokens, "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    goals, result = [], {"sampling": str(CHAT), "bandwidth": bandwidth, "probes": probes, "probe_gb": gb,
                         "weights_bytes": weight_bytes(target),
                         "sets": {}}
    for name, prompts in sets.items():
        arms = all_arms[name]
        kv = [kv_bytes(target, length) for length in arms.lengths]
        floor = {"weights": weight_bytes(target) * len(kv) / bandwidth, "kv": sum(kv) / bandwidth}
        decode = decode_ms(target, prompts, args.decode_tokens, args.decode_rounds, args.timer)
        goals += set_goals(name, arms, floor, decode)
        result["sets"][name] = {"prompts": len(prompts), "lengths": arms.lengths, "kv_bytes": kv, "floor": floor,
                                "decode_ms_per_token": decode, "arms": asdict(arms)["steps"]}
    split = split_misses(target, goals, all_arms, args, shapes)
    runs = ""
    if args.greedy_run or args.sampled_run:
        found, runs = run_goals(args.greedy_run, args.sampled_run)
        goals += found
    result.update(goals=[g.as_dict() for g in goals], parts=split, seconds=time.perf_counter() - started)
    out(header(target, args, result, all_arms))
    out(goals_table(goals))
    if split:
        out("\nwhere each miss's passes go (ms per pass, same run; attention: the profiler's share of the forward):\n"
            + parts_table(split))
    if runs:
        out("\nthe run folders' drafters:\n" + runs)
    if args.json:
        write_json(args.json, result)
    return result


def header(target: Target, args: argparse.Namespace, result: dict, all_arms: dict[str, Arms]) -> str:
    sets = "; ".join(f"{name}: {result['sets'][name]['prompts']} prompts, {len(arms.lengths)} caches "
                     f"(L {min(arms.lengths)}-{max(arms.lengths)}), plain greedy pass "
                     f"{arms.per_pass('plain greedy') * 1e3:.2f} ms" for name, arms in all_arms.items())
    weights = result["weights_bytes"]
    return (f"{args.model}, matmul {target.matmul}, {args.threads} thread(s), sampled = {result['sampling']} "
            f"(sampling=chat); {args.nodes} draft nodes (tree parents {Shapes(args.nodes).tree_parents}); "
            f"median of {args.repeats} rotated passes, {args.clock} clock; floor = (weights {weights / 1e6:.0f} MB + "
            f"the KV cache read) / read bandwidth {result['bandwidth'] / 1e9:.1f} GB/s (the faster probe over "
            f"{result['probe_gb']:.3f} GB: {probe_text(result['probes'])}); {sets}; "
            f"{result['seconds']:.0f} s\n")


if __name__ == "__main__":
    sys.exit(main() and 0)
