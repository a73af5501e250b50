"""The budget rule's settings on the estimator alone: ``python -m bench.budget_sweep``."""
