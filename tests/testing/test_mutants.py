"""The verifier gallery: the conformance kit, with its defaults, rejects every wrong verifier and a wrong warp."""

from __future__ import annotations

import pytest
import torch

from specfamily.core import acceptance, sampling, verify
from specfamily.core.types import SamplingConfig
from specfamily.testing import ConformanceError, assert_greedy_equivalent, assert_lossless, mutants
from specfamily.testing import rogues as rogue_module
from specfamily.testing.conformance import PROMPT, exact_distribution
from specfamily.testing.mutants import Hits, Mutant, side_rows_gallery, verifier_gallery, warp_gallery
from specfamily.testing.tiny import tiny_target

VERIFIERS = verifier_gallery()
WARPS = warp_gallery()
SIDE_ROWS = side_rows_gallery()


def _controls() -> list[tuple[type, float, SamplingConfig]]:
    """Each (honest drafter, tilt, config) a mutant is run with, once."""
    runs: list[tuple[type, float, SamplingConfig]] = []
    for mutant in VERIFIERS + WARPS:
        if (mutant.drafter, mutant.noise, mutant.sampling) not in runs:
            runs.append((mutant.drafter, mutant.noise, mutant.sampling))
    return runs


def test_the_gallery_covers_the_bugs_it_promises():
    assert [mutant.name for mutant in VERIFIERS] == [
        "resample_from_p", "row_off_by_one", "unwarped_p", "bonus_from_last_residual", "readmit_rejected_sibling",
    ]
    assert [mutant.name for mutant in WARPS] == ["top_p_before_temperature"]


def test_installing_a_mutant_patches_and_restores():
    walk, verify_draft, warp = verify._walk, acceptance.verify_draft, sampling.warp
    with VERIFIERS[0].installed():
        assert verify._walk is not walk
    with VERIFIERS[2].installed():
        assert acceptance.verify_draft is not verify_draft
    with WARPS[0].installed():  # everywhere: the loop's and the drafters' imported names too
        assert sampling.warp is not warp and acceptance.warp is sampling.warp and rogue_module.warp is sampling.warp
    assert (verify._walk, acceptance.verify_draft, sampling.warp, acceptance.warp, rogue_module.warp) == (
        walk, verify_draft, warp, warp, warp)


@pytest.mark.parametrize("mutant", VERIFIERS, ids=lambda mutant: mutant.name)
def test_the_kit_rejects_the_wrong_verifier(mutant):
    with mutant.installed() as hits, pytest.raises(ConformanceError, match="not lossless under") as info:
        assert_lossless(mutant.factory, configs=[mutant.sampling])
    print(f"\n{mutant.name} ({mutant.bug}): {hits.count} hits; {info.value}")
    assert hits.count >= 100, f"the wrong branch ran only {hits.count} times"


@pytest.mark.parametrize("mutant", WARPS, ids=lambda mutant: mutant.name)
def test_the_kit_rejects_a_wrong_warp_used_by_loop_and_drafter_alike(mutant):
    """The loop stays self-consistent under a wrong warp (p and q move together); only the independent law sees it."""
    target = tiny_target("llama")
    law = exact_distribution(target, PROMPT, 3, mutant.sampling)
    with mutant.installed() as hits:
        assert torch.equal(exact_distribution(target, PROMPT, 3, mutant.sampling), law)
        with pytest.raises(ConformanceError, match="not lossless under") as info:
            assert_lossless(mutant.factory, configs=[mutant.sampling])
    print(f"\n{mutant.name} ({mutant.bug}): {hits.count} hits; {info.value}")
    assert hits.count >= 100, f"the wrong warp changed a support only {hits.count} times"


@pytest.mark.parametrize(("honest", "noise", "config"), _controls(),
                         ids=lambda value: getattr(value, "__name__", str(value)))
def test_the_honest_twins_pass_with_the_real_verifier(honest, noise, config):
    """The control: each drafter and config a mutant is caught with passes with the real verifier and warp."""
    [fit] = assert_lossless(lambda target: honest(target, noise=noise), configs=[config])
    assert fit.depth.deepest_verified == 3, fit.describe()


def _correct_walk(hits: Hits):
    """A correct re-implementation of the verifier's tree walk, written as the mutants are (the honest sibling
    loop, the accepted child's own row of p, the residual when no child is accepted)."""
    def walk(children, tokens, q64, p64, draws):
        path, node, residual = [], -1, p64[0]
        while True:
            accepted, _, residual = mutants._try_children(children.get(node, []), tokens, q64, residual, draws)
            hits.count += 1
            if accepted is None:
                return path, draws.sample(residual)
            path.append(accepted)
            node, residual = accepted, p64[accepted + 1]
    return walk


@pytest.mark.parametrize(("honest", "noise", "config"), _controls(),
                         ids=lambda value: getattr(value, "__name__", str(value)))
def test_a_correct_reimplementation_of_the_verifier_passes_with_the_defaults(honest, noise, config):
    """The control for the mutants: the walk rewritten correctly, installed the way a mutant is, passes the kit's
    defaults at full depth with each drafter and config a mutant is caught with."""
    control = Mutant("correct_walk", "a correct walk", "specfamily.core.verify:_walk", _correct_walk, honest, noise,
                     config)
    with control.installed() as hits:
        [fit] = assert_lossless(control.factory, configs=[config])
    assert hits.count >= 1000 and not fit.untested_depths and fit.depth.deepest_verified == 3, fit.describe()


@pytest.mark.parametrize("mutant", SIDE_ROWS, ids=lambda mutant: mutant.name)
def test_the_kit_rejects_verification_rows_that_see_side_rows(mutant):
    """A draft's side rows must stay invisible to its verification rows: a mask that leaks them is caught by the
    sampled law and by greedy equality alike."""
    with mutant.installed() as hits, pytest.raises(ConformanceError, match="not lossless under") as info:
        assert_lossless(mutant.factory, configs=[mutant.sampling])
    print(f"\n{mutant.name} ({mutant.bug}): {hits.count} hits; {info.value}")
    assert hits.count > 0  # a pass shape's mask is built once and reused (Target caches layouts)
    with mutant.installed() as hits, pytest.raises(AssertionError, match="greedy tokens differ"):
        assert_greedy_equivalent(lambda target: mutant.drafter(target, noise=mutant.noise), families=("llama",))
    assert hits.count > 0


def test_the_side_rows_control_passes_with_the_real_mask():
    [mutant] = SIDE_ROWS
    [fit] = assert_lossless(mutant.factory, configs=[mutant.sampling])
    assert fit.depth.deepest_verified == 3, fit.describe()
    assert_greedy_equivalent(lambda target: mutant.drafter(target, noise=mutant.noise), families=("llama", "gpt2"))
