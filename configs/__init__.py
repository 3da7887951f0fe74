"""Shipped Hydra configs (installed as the package data ``specfamily.configs``): config.yaml; groups model, drafter, dataset, sampling, experiment."""
