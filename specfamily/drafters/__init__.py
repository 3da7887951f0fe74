"""Built-in drafter families, one package each; each registers itself through the plugin hook."""
