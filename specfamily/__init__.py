"""specfamily: speculative decoding with one lossless verifier and pluggable drafters.

Public API (names load lazily, so importing the package does no work)::

    import specfamily as sf
    target = sf.load_target("zoo:code-target")
    drafter = sf.create_drafter("small_model", target)
    result = sf.generate(target, drafter, prompt_ids, max_new_tokens=64)
    results = sf.generate_batch(target, drafter, [prompt_ids, other_ids], max_new_tokens=64)  # many at once
    rows = sf.load_run("runs/2025-01-01_12-00-00")  # a comparison run's rows as a datasets.Dataset
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "load_target": "specfamily.core.target",
    "Target": "specfamily.core.target",
    "generate": "specfamily.core.loop",
    "generate_batch": "specfamily.core.batch_loop",
    "SamplingConfig": "specfamily.core.types",
    "Draft": "specfamily.core.types",
    "VerifyOutcome": "specfamily.core.types",
    "DecodeContext": "specfamily.core.context",
    "GenerationResult": "specfamily.core.types",
    "Metrics": "specfamily.core.metrics",
    "Drafter": "specfamily.core.drafter",
    "BaseDrafter": "specfamily.core.drafter",
    "verify_chain": "specfamily.core.verify",
    "verify_tree": "specfamily.core.verify",
    "warp": "specfamily.core.sampling",
    "create_drafter": "specfamily.core.plugins",
    "list_drafters": "specfamily.core.plugins",
    "hookimpl": "specfamily.core.hookspecs",
    "load_run": "specfamily.eval.table",
}
_MODULES = {"theory": "specfamily.core.theory", "testing": "specfamily.testing"}

__all__ = sorted([*_EXPORTS, *_MODULES, "__version__"])


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in _MODULES:
        return import_module(_MODULES[name])
    raise AttributeError(f"module 'specfamily' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
