"""Packaging that pyproject.toml cannot say: the top-level ``configs/`` ships inside the package.

``configs/`` (the Hydra config groups, the one source) is installed as ``specfamily/configs``, so
a wheel or any non-editable install has it, and an editable install maps it back to the checkout.
Everything else is declared in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["specfamily*"]), "specfamily.configs"],
    package_dir={"specfamily.configs": "configs"},
)
