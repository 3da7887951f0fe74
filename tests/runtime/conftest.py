"""Fixtures shared by the runtime tests."""

import os

import pytest

from specfamily.runtime import kernel


@pytest.fixture(scope="module")
def module():
    """The built stream kernel extension (one build per session: ``stream_kernel`` is memoised); skipped where it
    cannot build, failed instead under ``SPECFAMILY_REQUIRE_KERNEL`` (CI builds it from a clean clone)."""
    built = kernel.stream_kernel()
    if not built.available:
        if os.environ.get("SPECFAMILY_REQUIRE_KERNEL"):
            pytest.fail(f"the stream kernel must build here: {built.reason}")
        pytest.skip(f"stream kernel unavailable: {built.reason}")
    return built.module
