"""Shipped Hydra configs, installed as the package data ``specfamily.configs``.

config.yaml and the groups model, drafter, dataset, sampling and experiment.
"""
