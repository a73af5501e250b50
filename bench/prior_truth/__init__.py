"""The prior against the truth: ``python -m bench.prior_truth`` (see __main__.py)."""
