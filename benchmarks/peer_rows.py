"""The peer benchmark's rows that need no sweep: drafters against plain ``generate`` (one row, or one per mode),
self_spec against transformers' early-exit assistant, and the oracle (the loop's ceiling). ``benchmarks/peer.py``
builds and measures them. Every drafter row times our plain decoding beside it (``Method.plain``) and builds its
drafter afresh for the warm-up and each repeat (``Method.ours``, see ``pairs``); one object built here only names
the row."""

from __future__ import annotations

import copy

import common
from common import Method
from peer_setup import Setup


def self_spec_row(setup: Setup, options: dict) -> Method:
    import specfamily as sf

    make = lambda: sf.create_drafter("self_spec", setup.target, **options)  # noqa: E731
    drafter = make()
    layers, gamma = setup.target.num_layers, drafter.policy.next_gamma()
    exit_at = setup.args.early_exit or _kept_layers(drafter, layers)
    note = "skips " + ",".join(f"{kind}:{index}" for kind, index in sorted(getattr(drafter, "skipped", ())))
    model, n = setup.target.model, setup.max_new_tokens
    if setup.args.defaults:
        theirs = setup.hf(assistant_early_exit=exit_at)
        return Method("self_spec default", setup.ours(make), theirs, f"early exit at {exit_at}/{layers}, "
                      "its default schedule", f"{note}; ours: {policy_note(drafter)}", setup.plain())

    def theirs(prompt):
        """Early exit drafts with the target's own generation config: make it a constant gamma like ours."""
        saved = model.generation_config
        config = copy.deepcopy(saved)
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
        config.assistant_confidence_threshold = 0.0
        model.generation_config = config
        try:
            return common.hf_generate(model, prompt, n, assistant_early_exit=exit_at)
        finally:
            model.generation_config = saved

    return Method(f"self_spec gamma={gamma}", setup.ours(make), theirs,
                  f"early exit at {exit_at}/{layers}, constant {gamma}", note, setup.plain())


def policy_note(drafter) -> str:
    """The draft-length policy a drafter runs under (auto: cost-aware, may draft nothing)."""
    return type(drafter.policy).__name__.removesuffix("Policy").lower()


def _kept_layers(drafter, layers: int) -> int:
    """Layers transformers' early exit should run to match the drafter's work (sub-layers count one half)."""
    skipped = getattr(drafter, "skipped", None)
    if skipped is None:
        return max(1, layers // 2)
    return max(1, min(layers, round(layers - len(skipped) / 2)))


def plain_vs_ours(setup: Setup, name: str, options: dict) -> Method:
    import specfamily as sf

    make = lambda: sf.create_drafter(name, setup.target, **options)  # noqa: E731
    make()  # fails here, at build time, when the drafter cannot be created
    return Method(name, setup.ours(make), setup.hf(), "plain generate", plain=setup.plain())


def modes_vs_plain(setup: Setup, name: str, options: dict, modes: dict[str, dict]) -> list[Method]:
    """One row per drafter mode (e.g. Medusa's calibrated tree and its top-1 chain), each against plain generate."""
    import specfamily as sf

    rows = []
    for label, mode in modes.items():
        make = lambda mode=mode: sf.create_drafter(name, setup.target, **{**mode, **options})  # noqa: E731
        make()  # fails here, at build time, when the drafter cannot be created
        rows.append(Method(f"{name} {label}", setup.ours(make), setup.hf(), "plain generate", plain=setup.plain()))
    return rows


def oracle_row(setup: Setup) -> Method:
    from specfamily.testing import OracleDrafter

    class PrimedOracle(OracleDrafter):
        """OracleDrafter whose continuation is the reference computed before timing (begin costs nothing)."""

        def begin(self, ctx) -> None:
            super(OracleDrafter, self).begin(ctx)
            self.continuation = table[tuple(ctx.prompt_ids.tolist())]

    table = {tuple(p): p + r for p, r in zip(setup.prompts, setup.reference, strict=False)}
    gamma = setup.args.oracle_gamma
    return Method(f"oracle gamma={gamma}", setup.ours(lambda: PrimedOracle(gamma=gamma)), setup.hf(),
                  "plain generate", "alpha = 1: the loop's ceiling", setup.plain())
