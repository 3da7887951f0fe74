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
