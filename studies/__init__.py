"""Studies: questions about the design answered with a measurement, kept as documented scripts.

Not a product package and not a benchmark a user runs on their machine (those are bench/):
each study answers one question the docs quote (its results file in bench/results/, its
command in its docstring and in the results file), and can be run again to check the answer.

- ``python -m studies.prior_truth``: the prior against a 64-sample truth at a run's snapshots
  (docs/prior.md, docs/benchmarks.md "The prior against the truth");
- ``python -m studies.estimator_mse``: the estimator alone, baseline MSE of V0.5 against GRPO
  per prior quality, and the batched against the sequential budget plan (docs/estimator.md).

They import the product only (tests/unit/test_structure.py); bench.sim reads prior_truth's
file with the study's own arithmetic (``studies.prior_truth.analysis.error_stats``).
"""
