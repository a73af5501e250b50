"""Chaos benchmark: one fault at a time injected into real runs of the default task, judged
on the run's own files (every admitted prompt's fate by uid). ``python -m tests.acceptance.chaos``; see
``__main__`` for the scenarios and docs/reliability.md for the results."""
