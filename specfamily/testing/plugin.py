"""pytest plugin (entry point ``pytest11``): fixtures for drafter authors."""

from __future__ import annotations

import pytest


@pytest.fixture
def specfamily_tiny_target():
    """Factory fixture: ``specfamily_tiny_target(family="llama", vocab_size=8, ...)`` -> Target."""
    from specfamily.testing.tiny import tiny_target

    return tiny_target


@pytest.fixture
def specfamily_conformance():
    """The conformance module: ``.assert_lossless(factory)``, ``.assert_greedy_equivalent(factory)``."""
    from specfamily.testing import conformance

    return conformance


@pytest.fixture
def specfamily_rogues():
    """The rogues' gallery (``specfamily.testing.rogues.rogue_gallery()``): subtly wrong drafters, each with a
    sampling config under which the conformance suite rejects it. A test of yours that passes one lacks power."""
    from specfamily.testing.rogues import rogue_gallery

    return rogue_gallery()
