"""Experiments: datasets, the comparison runner, results, sweeps, reports and plots.

``specfamily`` (:mod:`specfamily.cli`) runs a comparison from the shipped configs;
:func:`specfamily.eval.runner.run_experiment` is the same from Python; ``specfamily-report DIR`` rebuilds a report.
"""
