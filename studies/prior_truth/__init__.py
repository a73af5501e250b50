"""The prior against the truth: ``python -m studies.prior_truth`` (see __main__.py)."""
