"""The real model as it runs now against the float32 learner before issue 42, side by side
in one benchmark run: ``python -m bench.real_model --fp32-baseline``.

The main run is the config as a user runs it (``optim.dtype`` and ``generators.engine.dtype``
``auto``: on a CPU, this machine's probe for the model, ``common/cpu_dtype.py``; packed rows of
``optim.pack_row_tokens``); the baseline (``fp32``) is the same config as the learner and
engine ran before: both float32, each micro-batch in one packed row (``FP32``), run after it
on the same machine. Beside the runs, on the same batch in processes of their own
(``measure``): a plain transformers forward and backward in float32 and under bf16 autocast,
and the learner's own step in float32 in one row (before), float32 in rows, and ``auto``. The pinned figures (``learner_tokens_per_s``, ``plain_tokens_per_s``,
``step_time_s``, ``dtype_probe``) go to the top level of real_model.json, each dtype's run
under ``by_dtype``.
"""
from __future__ import annotations

FP32 = ["optim.dtype=fp32", "generators.engine.dtype=float32", "optim.pack_row_tokens=null"]


def probe_figures(model_path: str) -> dict:
    """This machine's probe for the model (cached, or run now), as real_model.json keeps it."""
    from common.cpu_dtype import cpu_dtype

    p = cpu_dtype(model_path)
    keep = ("chosen", "source", "fp32_gflops", "bf16_gflops", "matmul_ratio",
            "fp32_fwd_bwd_tokens_per_s", "bf16_fwd_bwd_tokens_per_s", "fwd_bwd_ratio")
    return {k: (round(p[k], 2) if isinstance(p[k], float) else p[k]) for k in keep if k in p}


def same_batch(model_path: str, log) -> dict:
    """Trained tokens/s on one 16 x 112-token batch, one thread, each in its own process: a
    plain forward and backward (fp32, bf16) and the learner's step (float32 in one row as
    before, float32 in rows, auto)."""
    from bench.real_model.measure import in_subprocess

    out = {"plain_tokens_per_s": {}, "learner_same_batch_tokens_per_s": {}}
    for kind, key, named in (
            ("plain", "plain_tokens_per_s", {"fp32": ("fp32",), "bf16": ("bf16",)}),
            ("learner", "learner_same_batch_tokens_per_s", {
                "fp32_one_row": ("fp32", "one"), "fp32": ("fp32", "auto"),
                "auto": ("auto", "auto")})):
        for name, args in named.items():
            out[key][name] = in_subprocess(kind, model_path, *args)
            log(f"{kind} step, {name}: {out[key][name]} tokens/s")
    return out


def mismatch(curve_rows: list[dict]) -> dict:
    """The off-policy figures over a run's steady steps: behaviour (engine) against learner
    log-probs, staleness and dtype together (``approx_kl``: k3, token mean; ``is_weight``)."""
    import numpy as np

    from bench.real_model.analysis import steady

    w = steady(curve_rows)

    def mean(key):
        vals = [r[key] for r in w if r.get(key) is not None]
        return round(float(np.mean(vals)), 6) if vals else None

    return {"approx_kl": mean("approx_kl"), "is_weight": mean("is_weight"),
            "truncated_fraction": mean("truncated_fraction")}


def run_figures(result: dict, run_dir) -> dict:
    """One run's figures for the side-by-side table (``result``: ``analysis.analyse``'s)."""
    from bench.real_model.analysis import read_run

    rows, summary, _ = read_run(run_dir)
    return {"dtypes": summary.get("dtypes"), "steps": result["steps"],
            "train_s": result["train_s"],
            "step_time_s": result["step_split_s"]["step_s"],
            "step_split_s": result["step_split_s"],
            "learner_tokens_per_s": result["learner"]["tokens_per_s"],
            "generator_tokens_per_busy_s": result["generators"]["tokens_per_busy_s"],
            "generator_share_of_engine_limit": result["generator_share_of_engine_limit"],
            "engine_curve": result["engine_curve"],
            "start_accuracy": result["start_accuracy"], "end_accuracy": result["end_accuracy"],
            "heldout_gain_se": result["heldout_gain_se"], "mismatch": mismatch(rows)}


def side_by_side(auto: dict, fp32: dict, batch: dict, probe: dict) -> dict:
    """The pinned top-level figures and the ratios the issue's aims read."""
    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    return {
        "dtype_probe": probe,
        "learner_tokens_per_s": {"fp32": fp32["learner_tokens_per_s"],
                                 "auto": auto["learner_tokens_per_s"]},
        "step_time_s": {"fp32": fp32["step_time_s"], "auto": auto["step_time_s"]},
        **batch,
        "heldout_gain_se_combined": auto["heldout_gain_se"],
        "ratios": {
            "learner_auto_over_fp32": ratio(auto["learner_tokens_per_s"],
                                            fp32["learner_tokens_per_s"]),
            "step_time_fp32_over_auto": ratio(fp32["step_time_s"], auto["step_time_s"]),
            "learner_same_batch_auto_over_fp32_one_row": ratio(
                batch["learner_same_batch_tokens_per_s"]["auto"],
                batch["learner_same_batch_tokens_per_s"]["fp32_one_row"]),
            "learner_over_plain_same_dtype": {
                "fp32": ratio(batch["learner_same_batch_tokens_per_s"]["fp32"],
                              batch["plain_tokens_per_s"]["fp32"]),
                "auto": ratio(batch["learner_same_batch_tokens_per_s"]["auto"],
                              batch["plain_tokens_per_s"][probe["chosen"]])}},
        "by_dtype": {"auto": auto, "fp32": fp32},
    }
