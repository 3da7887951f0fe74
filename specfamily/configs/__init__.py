"""Shipped Hydra configs (package data): config.yaml; groups model, drafter, dataset, sampling, experiment."""
