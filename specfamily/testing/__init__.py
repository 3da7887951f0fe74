"""Conformance suite and test-only drafters for drafter authors.

``assert_lossless(factory)`` and ``assert_greedy_equivalent(factory)`` take ``factory(target) -> Drafter`` and build
their own tiny random targets. ``specfamily.testing.rogues`` (wrong drafters) and ``specfamily.testing.mutants``
(wrong verifiers) show whether your own tests have power. Names load lazily.
"""

from importlib import import_module

_EXPORTS = {
    "N_TOKENS": "conformance",
    "PROMPT": "conformance",
    "SAMPLING_MATRIX": "conformance",
    "ConformanceError": "conformance",
    "ConformanceWarning": "conformance",
    "FitResult": "conformance",
    "assert_lossless": "conformance",
    "check_fit": "conformance",
    "KitSetting": "setting",
    "draft_model_for": "conformance",
    "exact_distribution": "conformance",
    "DepthRecorder": "depth",
    "DepthStats": "depth",
    "GreedyReport": "greedy",
    "assert_greedy_equivalent": "greedy",
    "greedy_report": "greedy",
    "detection_power": "power",
    "samples_for_power": "power",
    "rogue_gallery": "rogues",
    "verifier_gallery": "mutants",
    "warp_gallery": "mutants",
    "side_rows_gallery": "mutants",
    "OracleDrafter": "drafters",
    "RandomTreeDrafter": "drafters",
    "WrongDrafter": "drafters",
    "tiny_model": "tiny",
    "tiny_target": "tiny",
    "SyncCounter": "syncs",
    "count_syncs": "syncs",
    "on_device": "syncs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specfamily.testing' has no attribute {name!r}")
    return getattr(import_module(f"specfamily.testing.{_EXPORTS[name]}"), name)
