"""Throughput of the training modes measured side by side on this machine (python -m
bench.throughput): steady-state windows, repeats with their spread, the CPU limit, and the
simulator calibrated with what was measured."""
from bench.throughput.calibration import calibration, sim_check
from bench.throughput.measure import cpu_limit, spread, steady_state

__all__ = ["calibration", "cpu_limit", "sim_check", "spread", "steady_state"]
