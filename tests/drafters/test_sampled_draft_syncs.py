"""A sampled draft on an accelerator waits for the host only to hand its tokens over, never for its draws.

Each drafter's model runs on the host and hands back stand-in device tensors (specfamily.testing.syncs.on_device):
so the count sees everything the drafter does with its model's outputs: warping, drawing each token
(``host.draw``: torch.multinomial(q, 1) read q twice per token on CUDA), feeding it back, building the Draft. What
remains is the Draft's copy of its tokens to the host (and EAGLE's of q, in the same line); the models' own
forwards are not counted here (tests/gpu runs them on a device).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import specfamily as sf
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.eagle.drafter import EagleDrafter
from specfamily.drafters.self_spec.drafter import SelfSpecDrafter
from specfamily.drafters.small_model.drafter import SmallModelDrafter
from specfamily.testing import draft_model_for, tiny_target
from specfamily.testing.syncs import SyncCounter, on_device, on_host

SAMPLING = sf.SamplingConfig(temperature=0.7, top_p=0.9)
GAMMA = 4


def _ctx(target, prompt: list[int]) -> sf.DecodeContext:
    ids = torch.tensor(prompt)
    return sf.DecodeContext(target, ids, SAMPLING, torch.Generator().manual_seed(0), list(prompt))


def _counted(drafter, ctx) -> tuple[sf.Draft, SyncCounter]:
    with SyncCounter() as syncs:
        draft = drafter.propose(ctx, GAMMA)
    return draft, syncs


def _where(syncs: SyncCounter) -> list[tuple[str, str]]:
    return [(s.kind, s.where.rsplit("/", 1)[-1].split(":")[0]) for s in syncs.syncs]


def _assert_drawn_from_q(draft: sf.Draft) -> None:
    q = on_host(draft.q)
    assert draft.tokens.device.type == "cpu" and draft.tokens.numel() == GAMMA
    assert torch.all(q[torch.arange(GAMMA), draft.tokens] > 0)  # each token drawn where its q has mass


def _small_model(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = SmallModelDrafter(target, model=draft_model_for(target), gamma=GAMMA)
    ctx = _ctx(target, [1, 2, 3])
    drafter.begin(ctx)
    forward = drafter.runner.forward
    monkeypatch.setattr(
        drafter.runner, "forward", lambda feed: SimpleNamespace(logits=on_device(forward(on_host(feed)).logits))
    )
    return drafter, ctx


def _eagle(monkeypatch):
    target = tiny_target("llama", vocab_size=16)
    drafter = EagleDrafter(target, weights="random", mode="chain", gamma=GAMMA)
    prompt = [1, 2, 3]
    ctx = _ctx(target, prompt)
    drafter.begin(ctx)
    out = target.model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    ctx.tokens.append(7)
    drafter.observe(VerifyOutcome([7], [], 0, out.hidden_states[-1][0], 0))
    catch_up, logits, step = drafter._catch_up, drafter._draft_logits, drafter._step
    monkeypatch.setattr(drafter, "_catch_up", lambda ctx: on_device(catch_up(ctx)))
    monkeypatch.setattr(drafter, "_draft_logits", lambda hidden: on_device(logits(on_host(hidden))))
    monkeypatch.setattr(
        drafter,
        "_step",
        lambda tokens, inputs, positions, mask, cache: on_device(
            step(on_host(tokens), on_host(inputs), on_host(positions), mask, cache)
        ),
    )
    return drafter, ctx


def _self_spec(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = SelfSpecDrafter(target, skip=["mlp:0"], gamma=GAMMA)
    ctx = _ctx(target, [1, 2, 3])
    drafter.begin(ctx)
    hidden_of, logits_of = drafter._passes(target)
    monkeypatch.setattr(
        drafter,
        "_passes",
        lambda target: (
            lambda ids, positions, mask, cache: on_device(hidden_of(on_host(ids), on_host(positions), mask, cache)),
            lambda hidden: on_device(logits_of(on_host(hidden))),
        ),
    )
    return drafter, ctx


@pytest.mark.parametrize(
    ("make", "module"), [(_small_model, "drafter.py"), (_self_spec, "drafter.py")], ids=["small_model", "self_spec"]
)
def test_a_sampled_chain_waits_once_to_hand_its_tokens_over(monkeypatch, make, module):
    draft, syncs = _counted(*make(monkeypatch))
    assert _where(syncs) == [("copy to host", module)], syncs  # torch.cat(tokens).cpu(); q stays on the device
    _assert_drawn_from_q(draft)


def test_an_eagle_chain_waits_only_to_hand_its_tokens_and_q_over(monkeypatch):
    draft, syncs = _counted(*_eagle(monkeypatch))
    assert _where(syncs) == [("copy to host", "host.py")], syncs  # tokens and q packed: to_host waits once
    _assert_drawn_from_q(draft)


def test_the_count_has_power_multinomial_draws_are_caught(monkeypatch):
    """The same small-model draft drawing with torch.multinomial(q, 1), as it did: 2 reads of q per token."""
    import specfamily.drafters.small_model.drafter as small_model

    monkeypatch.setattr(small_model, "draw", lambda q, generator: torch.multinomial(q, 1, generator=generator))
    _, syncs = _counted(*_small_model(monkeypatch))
    assert [s.kind for s in syncs.syncs].count("read inside an op") == 2 * GAMMA, syncs
