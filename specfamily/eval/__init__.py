"""Experiments: datasets, the comparison runner, results, sweeps, reports and plots.

``specfamily`` (the Hydra app in :mod:`specfamily.cli`) runs a comparison from the configs in
``configs/`` (shipped as ``specfamily/configs``); :func:`specfamily.eval.runner.run_experiment` is the same from Python;
``specfamily-report DIR`` (:mod:`specfamily.eval.report`) rebuilds a report from saved results.
Nothing is imported here, so importing the package costs nothing.
"""
