"""Conformance suite and test-only drafters for drafter authors."""
