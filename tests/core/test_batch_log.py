"""The batched loop's debug log (core/batch_log.py): one line a pass when enabled, every slot's draft and acceptance as
the pass fed and verified them; nothing when disabled."""

import logging
import re

import torch

import specfamily as sf
from specfamily.testing import RandomTreeDrafter, tiny_target

LOGGER = "specfamily.core.batch_log"


def _run(caplog, level: int):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=generator).tolist() for n in (5, 7, 4)]
    with caplog.at_level(level, logger=LOGGER):
        results = sf.generate_batch(target, RandomTreeDrafter(target, gamma=2, nodes=3), prompts, max_new_tokens=6,
                                    max_batch=2)
    return results, [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_line_a_pass_with_each_slots_draft_and_acceptance(caplog):
    results, lines = _run(caplog, logging.DEBUG)
    assert [int(re.match(r"pass (\d+) ", line).group(1)) for line in lines] == list(range(1, len(lines) + 1))
    assert lines[0].startswith("pass 1 prefill") and any(" steady " in line for line in lines)
    slots = [part for line in lines for part in line.split(" | ")[1].split("; ")]
    fed = [int(re.search(r" g=(\d+)", s).group(1)) for s in slots]
    accepted = [int(re.search(r" a=(\d+)", s).group(1)) for s in slots]
    assert all(a <= g for a, g in zip(accepted, fed, strict=True)) and sum(fed) > 0
    assert sum(accepted) == sum(r.metrics.accepted_tokens for r in results)  # every accepted token, logged once
    assert {int(re.match(r"r(\d+)", s).group(1)) for s in slots} == {0, 1, 2}


def test_nothing_is_logged_when_debug_is_off(caplog):
    _, lines = _run(caplog, logging.INFO)
    assert lines == []
