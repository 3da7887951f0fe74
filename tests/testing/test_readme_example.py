"""README's "Adding a drafter", run as a new user would: its drafter module and its test, verbatim."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from specfamily.testing import ConformanceWarning

README = Path(__file__).resolve().parents[2] / "README.md"


def adding_a_drafter_code() -> tuple[str, str]:
    """The section's drafter module and its test function, as the README prints them."""
    section = README.read_text().split("## Adding a drafter", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    module = next(block for block in blocks if "class MyDrafter" in block)
    test = next(block for block in blocks if "def test_mine_is_lossless" in block)
    return module, test


def test_the_readme_drafter_passes_the_readme_test():
    """The README's copier (q=None) and its two-line test pass with the kit's defaults; a depth the kit could not
    reach would pass with a warning naming it, never fail the honest drafter."""
    module, test = adding_a_drafter_code()
    namespace: dict = {"__name__": "mypkg.drafter"}
    exec(compile(module, "README.md (mypkg/drafter.py)", "exec"), namespace)  # the @sf.hookimpl is inert here
    exec(compile(test, "README.md (the test)", "exec"), namespace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace["test_mine_is_lossless"]()
    for warning in caught:
        if issubclass(warning.category, ConformanceWarning):
            text = str(warning.message)
            assert "not tested to power" in text and "What was tested: tiny llama target (vocabulary 8" in text


def test_the_readme_code_is_what_the_test_runs():
    module, test = adding_a_drafter_code()
    assert "return sf.Draft.chain(ctx.tokens[-gamma:])" in module and "registry.register(\"mine\"" in module
    assert "assert_lossless(lambda target: MyDrafter(target))" in test
