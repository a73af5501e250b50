"""The prior server benchmark (python -m bench.prior): predict latency and within-step AUC on
proxy RL runs (``bench.prior.proxy``), and the embedded prior's calibration."""
from bench.prior.proxy import arithmetic_problems, pair_auc, simulate_run, word_problems

__all__ = ["arithmetic_problems", "pair_auc", "simulate_run", "word_problems"]
