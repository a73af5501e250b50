"""The report's sections: each a function ``RunData -> HTML`` (``cluster/report/page.py`` puts them
on the page in the order of ``SECTIONS``). Every figure is an ``<img class="plot">`` whose
``id`` is its key in ``PLOTS`` and whose ``alt`` is its title; a figure without data is a
``<p class="nodata" id="<plot id>-nodata">`` that says why. The accounting checks and the
prior's reliability bins they show are computed in ``cluster/report/analysis.py``.
"""
from __future__ import annotations

import html
import math
from collections import Counter

import numpy as np

from cluster.records.metrics import PRIOR_WINDOW_STEPS, rolling_prior_error
from cluster.records.step import HeldOut
from cluster.records.summary import RunSummary, Totals
from cluster.report.analysis import (accounting_checks, file_counts, reliability_bins,
                                     summary_accounting)
from cluster.report import plots
from cluster.report.data import RunData, as_float, held_out
from common.records import DropReason

EMPTY = RunSummary(0, 0, Totals())  # what a section reads of a run without summary.json

PLOTS = {
    "plot-learning-steps": "Reward and held-out accuracy against steps",
    "plot-learning-wall": "Reward and held-out accuracy against wall-clock",
    "plot-k-heatmap": "k histogram per step (heatmap)",
    "plot-prior-steps": "Prior acceptance rate and calibration error per step",
    "plot-prior-reliability": "Prior reliability: predicted p against observed success",
    "plot-generators-steps": "Generator utilisation and slot occupancy per step",
    "plot-generators-per-gen": "Utilisation per generator (whole run)",
    "plot-rollout-gantt": "Rollout spans per generator (timeline)",
    "plot-staleness": "Staleness per step (mean and max)",
    "plot-step-time": "Learner step time split: wait / train / sync / eval",
}
MAX_SPANS = 20_000  # the timeline draws at most this many (the newest) rollout spans


def figure(plot_id: str, b64: str | None, why: str = "", caption: str = "") -> str:
    title = html.escape(PLOTS[plot_id])
    cap = f'<p class="caption">{caption}</p>' if caption else ""
    if b64 is None:
        return (f'<h3>{title}</h3><p class="nodata" id="{plot_id}-nodata">no data'
                f"{': ' + html.escape(why) if why else ''}</p>")
    return (f'<h3>{title}</h3><img class="plot" id="{plot_id}" alt="{title}" title="{title}" '
            f'src="data:image/png;base64,{b64}">{cap}')


def table(header: list[str], rows: list[list], cls: str = "", row_cls=None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for i, r in enumerate(rows):
        rc = f' class="{row_cls[i]}"' if row_cls and row_cls[i] else ""
        body.append(f"<tr{rc}>" + "".join(f"<td>{_fmt(v)}</td>" for v in r) + "</tr>")
    return f'<table class="{cls}"><tr>{head}</tr>{"".join(body)}</table>'


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "—"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _metric_name(run: RunData) -> str:
    return str((run.summary.eval_metric if run.summary else None)
               or (run.config.get("run") or {}).get("eval_metric") or "accuracy")


# -- overview ------------------------------------------------------------------------------
def overview(run: RunData) -> str:
    s = run.summary or EMPTY
    out = []
    if run.summary is None:
        out.append('<p class="banner fail">no summary.json: the run is still going, crashed, or '
                   "was killed before its end</p>")
    elif run.status == "stalled":
        rep = s.stall_report if isinstance(s.stall_report, dict) else {}
        out.append(f'<div class="banner fail" id="status-stalled"><b>&#9888; status: stalled</b>: '
                   f"no learner step within the watchdog's limit, waiting on "
                   f"<b>{html.escape(str(s.stalled_on or '?'))}</b>"
                   + (table(["stall report", "value"], [[k, v] for k, v in rep.items()]) if rep else "")
                   + "</div>")
    else:
        out.append(f'<p>status: <b id="status">{html.escape(run.status)}</b></p>')
    if not run.metrics:
        out.append('<p class="nodata" id="metrics-nodata">no data: metrics.jsonl has no step</p>')
    rows = [["mode / algo", f"{s.mode or run.config.get('mode', '?')} / "
             f"{s.algo or (run.config.get('algo') or {}).get('name', '?')}"],
            ["steps (metrics.jsonl lines)", len(run.metrics)],
            ["steps (summary)", s.steps if run.summary else None], ["wall time (s)", s.wall_time_s],
            ["training wall time, evaluations excluded (s)", s.train_wall_time_s],
            ["prompts/s", s.prompts_per_s], ["rollouts/s", s.rollouts_per_s],
            ["generator busy fraction", s.generator_busy_fraction],
            ["generator slot occupancy", s.generator_slot_occupancy],
            ["decode tokens/s", s.decode_tokens_per_s],
            ["learner idle fraction", s.learner_idle_fraction],
            [f"held-out {_metric_name(run)} at the start", _pm(s.eval_initial)],
            [f"held-out {_metric_name(run)} at the end", _pm(s.eval_final)]]
    out.append(table(["", "value"], rows, cls="overview"))
    if run.bad_lines:
        out.append(f'<p class="fail">{run.bad_lines} line(s) of the run\'s JSONL files did not '
                   "parse (skipped)</p>")
    if run.summary is not None:
        scalars = [[k, v] for k, v in s.to_json().items() if not isinstance(v, (dict, list))]
        out.append("<details><summary>every scalar of summary.json</summary>"
                   + table(["key", "value"], scalars) + "</details>")
    cfg = run.dir / "config.yaml"
    if cfg.exists():
        out.append(f"<details><summary>config.yaml</summary><pre>{html.escape(cfg.read_text())}"
                   "</pre></details>")
    return "\n".join(out)


def _pm(ev: HeldOut | None) -> str | None:
    """The run metric's accuracy ± its SE, or None."""
    v, e = as_float(ev and ev.accuracy), as_float(ev and ev.accuracy_se)
    if math.isnan(v):
        return None
    return f"{v:.4f}" + ("" if math.isnan(e) else f" ± {e:.4f}")


# -- learning curves -----------------------------------------------------------------------
def wall_clock(run: RunData) -> np.ndarray:
    """Seconds from the run's start to the end of each step (its evaluation included)."""
    t0, end, ev = run.t0, run.col(lambda m: m.t_step_end), np.nan_to_num(run.col(lambda m: m.eval_time_s), nan=0.0)
    if t0 is not None and np.isfinite(end).any():
        return end + ev - t0
    return np.cumsum(np.nan_to_num(run.col(lambda m: m.step_time_s), nan=0.0) + ev)


def learning(run: RunData) -> str:
    s, steps, metric = run.summary or EMPTY, run.steps, _metric_name(run)
    acc, se = run.col(held_out("accuracy")), run.col(held_out("accuracy_se"))
    other_name = {"sampled": "greedy", "greedy": "sampled"}.get(metric)
    other = (other_name, run.col(held_out(other_name))) if other_name else None
    out = []
    for pid, x, xlabel in (("plot-learning-steps", steps, "step"),
                           ("plot-learning-wall", wall_clock(run), "wall-clock since the start (s)")):
        start = end = None
        first, final = s.eval_initial, s.eval_final
        if first is not None and not math.isnan(as_float(first.accuracy)):
            start = (0.0, as_float(first.accuracy), as_float(first.accuracy_se))
        ok = np.flatnonzero(np.isfinite(acc))
        if ok.size:
            i = ok[-1]
            end = (float(x[i]), float(acc[i]), float(se[i]))
            if start is None:
                start = (float(x[ok[0]]), float(acc[ok[0]]), float(se[ok[0]]))
        elif final is not None and not math.isnan(as_float(final.accuracy)) and len(x):
            end = (float(x[-1]), as_float(final.accuracy), as_float(final.accuracy_se))
        b64 = plots.learning(x, run.col(lambda m: m.reward_mean), x, acc, se, other, metric, start, end, xlabel)
        out.append(figure(pid, b64, "no reward_mean, eval_accuracy or initial accuracy",
                          "Top: mean reward of each step's trained rollouts. Bottom: held-out "
                          f"accuracy ({html.escape(metric)}) with a ±1 standard-error band; "
                          "diamonds mark the start and the end."))
    return "\n".join(out)


# -- k -------------------------------------------------------------------------------------
def k_section(run: RunData) -> str:
    hists = [m.k_hist if isinstance(m.k_hist, list) else [] for m in run.metrics]
    steps = run.steps
    if not any(hists) and run.prompts:  # older runs: rebuild from prompts.jsonl
        by_step: dict[int, Counter] = {}
        for p in run.prompts:
            if isinstance(p.get("k"), int) and isinstance(p.get("step"), int):
                by_step.setdefault(p["step"], Counter())[p["k"]] += 1
        steps = np.array(sorted(by_step), dtype=float)
        hists = [[by_step[int(st)].get(k, 0) for k in range(max(by_step[int(st)]) + 1)]
                 for st in steps]
    width = max((len(h) for h in hists), default=0)
    hist = np.zeros((len(hists), width))
    for i, h in enumerate(hists):
        hist[i, :len(h)] = [as_float(v) if not math.isnan(as_float(v)) else 0.0 for v in h]
    k_mean = run.col(lambda m: m.k_mean) if len(steps) == len(run.metrics) else np.full(len(steps), np.nan)
    b64 = plots.k_heatmap(steps, hist, k_mean) if len(steps) else None
    total = hist.sum(axis=0)
    rows = [[k, int(n), n / total.sum()] for k, n in enumerate(total) if n]
    return (figure("plot-k-heatmap", b64, "no k_hist in metrics.jsonl and no k in prompts.jsonl",
                   "Colour: share of each step's trained prompts with that k; line: k_mean.")
            + (table(["k", "prompts", "share"], rows, cls="k-total") if rows else ""))


# -- the prior -----------------------------------------------------------------------------
def prior(run: RunData) -> str:
    steps = run.steps
    rolled = rolling_prior_error([m.to_json() for m in run.metrics])
    out = [figure("plot-prior-steps", plots.prior_steps(
        steps, run.col(lambda m: m.prior_accept_rate), run.col(lambda m: m.prior_abs_error),
        rolled["prior_error_sd_corrected"], rolled["prior_bias"], PRIOR_WINDOW_STEPS),
                  "no prior_accept_rate or prior_abs_error (a run without a prior?)",
                  "prior_accept_rate: share of prompts whose real-time test kept the prior; "
                  "prior_abs_error: mean |p - observed success| over the step's prompts (the "
                  "observed rate's own noise included: an upper bound on the prior's error); "
                  "prior_error_sd_corrected: sqrt of E[(p - mu)^2] against the true success "
                  "rate mu, the noise of each prompt's first k_init rewards subtracted; "
                  "prior_bias: E[p - mu] (> 0: the prior over-predicts); both pooled over the "
                  f"last {PRIOR_WINDOW_STEPS} steps' prompts.")]
    out.append(prior_run_table(run.summary or EMPTY))
    task = run.config.get("task") or {}
    lo, hi = as_float(task.get("reward_low")), as_float(task.get("reward_high"))
    bins, why = reliability_bins(run.prompts, None if math.isnan(lo + hi) or hi <= lo else (lo, hi))
    full = [b for b in bins if b["n"]]
    sample = (f" (a sample: 1 in {run.prompts_stride} of the older lines)"
              if run.prompts_stride > 1 else "")
    cap = ""
    if full:
        n = sum(b["n"] for b in full)
        ece = sum(b["n"] * abs(b["p"] - b["obs"]) for b in full) / n
        cap = (f"{n} prompts from prompts.jsonl{sample}; count-weighted mean |mean p - observed| "
               f"over bins (ECE): {ece:.3f}.")
    out.append(figure("plot-prior-reliability", plots.reliability(bins), why, cap))
    if full:
        out.append(table(["predicted p bin", "prompts", "mean predicted p", "observed success",
                          "SE"], [[f"{b['lo']:.1f}–{b['hi']:.1f}", b["n"], b["p"], b["obs"],
                                   b["se"]] for b in full], cls="reliability"))
    return "\n".join(out)


def prior_run_table(s: RunSummary) -> str:
    """The prior's error over every trained prompt of the run (summary.json), or nothing."""
    rows = [["prior_abs_error", "mean |p - observed success|", s.prior_abs_error],
            ["prior_error_sd_corrected", "error sd against the truth, noise-corrected",
             s.prior_error_sd_corrected],
            ["prior_error_var_corrected", "its variance estimate (may be < 0)",
             s.prior_error_var_corrected],
            ["prior_bias", "bias E[p - mu]", s.prior_bias],
            ["prior_error_n", "prompts (first k_init rewards)", s.totals.prior_error_n or None]]
    rows = [r for r in rows if r[2] is not None]
    return table(["over the run", "", "value"], rows, cls="prior-run") if rows else ""


# -- generators ----------------------------------------------------------------------------
def generators(run: RunData) -> str:
    steps = run.steps
    out = [figure("plot-generators-steps", plots.generators_steps(
        steps, run.col(lambda m: m.generator_busy_fraction), run.col(lambda m: m.generator_slot_occupancy),
        run.col(lambda m: m.learner_idle_fraction), run.col(lambda m: m.decode_tokens_per_s)),
        "no generator_busy_fraction / generator_slot_occupancy in metrics.jsonl",
        "Slot occupancy: mean running sequences over the engines' max_num_seqs.")]
    per = (run.summary or EMPTY).generators
    per = [g for g in per if isinstance(g, dict)] if isinstance(per, list) else []
    out.append(figure("plot-generators-per-gen", plots.generators_bars(per) if per else None,
                      "no per-generator figures in summary.json"))
    if per:
        keys = ["alive", "busy_fraction", "slot_occupancy", "decode_tokens_per_s",
                "peak_decode_tokens_per_s", "fraction_of_peak"]
        out.append(table(["generator", *keys], [[g.get("index", i), *[g.get(k) for k in keys]]
                                                for i, g in enumerate(per)], cls="per-generator"))
    out.append(_gantt(run))
    return "\n".join(out)


def _gantt(run: RunData) -> str:
    t0 = run.t0
    spans = []
    for p in run.prompts[run.tail_start:]:
        for sp in p.get("spans") or []:
            if isinstance(sp, (list, tuple)) and len(sp) == 3:
                g, a, b = (as_float(v) for v in sp)
                if all(math.isfinite(v) for v in (g, a, b)) and b >= a:
                    spans.append((a, b, int(g)))
    if not spans:
        return figure("plot-rollout-gantt", None, "no rollout spans in prompts.jsonl")
    spans.sort()
    clipped = len(spans) > MAX_SPANS
    spans = spans[-MAX_SPANS:]
    t0 = t0 if t0 is not None else spans[0][0]
    lanes: dict[int, list[tuple[float, float]]] = {}
    for a, b, g in spans:
        lanes.setdefault(g, []).append((a - t0, b - t0))
    ends = run.col(lambda m: m.t_step_end) - t0
    lo, hi = spans[0][0] - t0, max(b for _, b, _ in spans) - t0
    ends = ends[np.isfinite(ends) & (ends >= lo) & (ends <= hi)]
    cap = (f"{len(spans)} sample spans of trained prompts"
           + (f" (the newest {MAX_SPANS})" if clipped or run.prompts_stride > 1 else "")
           + "; each row within a generator is one concurrently running sequence. "
           "Prompts dropped or in flight at the end are not in prompts.jsonl.")
    return figure("plot-rollout-gantt", plots.gantt(lanes, ends), "", cap)


# -- staleness and step time ---------------------------------------------------------------
def staleness_bound(config: dict) -> float | None:
    """The scheduler's staleness bound as the run had it (``Config.max_staleness``: 0 in sync
    mode, whatever ``rollout.max_staleness`` says); None for a config that no longer parses."""
    from cluster.config.schema import build_config

    try:
        return float(build_config(config).max_staleness)
    except ValueError:
        return None


def staleness(run: RunData) -> str:
    return figure("plot-staleness", plots.staleness(run.steps, run.col(lambda m: m.staleness_mean),
                                                    run.col(lambda m: m.staleness_max),
                                                    staleness_bound(run.config)),
                  "no staleness_mean / staleness_max in metrics.jsonl",
                  "Age of the trained samples in policy versions (trained version minus the "
                  "version that started the sample); dashed: the config's bound.")


STEP_PARTS = {"wait for batch": lambda m: m.learner_wait_s, "train": lambda m: m.train_time_s,
              "weight sync": lambda m: m.sync_time_s, "evaluation": lambda m: m.eval_time_s}


def step_time(run: RunData) -> str:
    parts = {name: run.col(get) for name, get in STEP_PARTS.items()}
    out = [figure("plot-step-time", plots.step_time(run.steps, parts),
                  "no learner_wait_s / train_time_s / sync_time_s / eval_time_s in metrics.jsonl")]
    totals = {n: float(np.nansum(v)) for n, v in parts.items() if np.isfinite(v).any()}
    if totals:
        whole = sum(totals.values()) or 1.0
        out.append(table(["part", "seconds (all steps)", "share"],
                         [[n, t, t / whole] for n, t in totals.items()], cls="step-time"))
    return "\n".join(out)


# -- accounting ----------------------------------------------------------------------------
def accounting(run: RunData) -> str:
    s = run.summary or EMPTY
    acct = summary_accounting(s)
    checks = accounting_checks(run)
    ident = checks[0]
    if ident[1] is None:
        head = f'<p class="banner nodata" id="accounting-identity">no data: {html.escape(ident[2])}</p>'
    else:
        cls, mark = ("ok", "&#10004;") if ident[1] else ("fail", "&#10008; identity fails:")
        head = (f'<p class="banner {cls}" id="accounting-identity"><span class="{cls}">{mark}</span>'
                f" admitted = trained + dropped + in flight at the end: {html.escape(ident[2])}</p>")
    files = file_counts(run)
    rows, cls = [], []
    for label, key in (("admitted", "prompts_admitted"), ("trained", "prompts_trained"),
                       ("dropped", "prompts_dropped")):
        rows.append([label, acct.get(key), files.get(key)])
        cls.append("")
    by_file = Counter(DropReason.kind(str(d.get("reason"))) for d in run.dropped or [])
    reasons = acct.get("drop_reasons") if isinstance(acct.get("drop_reasons"), dict) else {}
    for r in sorted({r for r, n in reasons.items() if n} | set(by_file)):
        rows.append([f"dropped: {r}", reasons.get(r), by_file.get(r, 0) if run.dropped is not None
                     else None])
        cls.append("sub")
    rows.append(["in flight at the end", acct.get("prompts_in_flight_at_end"),
                 files["prompts_in_flight_at_end"]])
    cls.append("")
    out = [head, table(["prompts", "summary.json", "run files"], rows, cls="accounting",
                       row_cls=cls)]
    crows = [[("<span class='ok'>&#10004;</span>" if ok else "<span class='fail'>&#10008;</span>")
              if ok is not None else "—", what, detail] for what, ok, detail in checks]
    out.append('<table class="checks"><tr><th></th><th>check</th><th>detail</th></tr>'
               + "".join(f"<tr><td>{m}</td><td>{html.escape(w)}</td><td>{html.escape(d)}</td></tr>"
                         for m, w, d in crows) + "</table>")
    if run.status == "stalled":
        out.append(f'<p class="fail">status: stalled (waiting on '
                   f"{html.escape(str(s.stalled_on or '?'))}): the coordinator's accounting "
                   "was not collected.</p>")
    return "\n".join(out)


SECTIONS = [("section-overview", "Overview", overview),
            ("section-accounting", "Prompt accounting", accounting),
            ("section-learning", "Reward and held-out accuracy", learning),
            ("section-k", "Rollouts per prompt (k)", k_section),
            ("section-prior", "The prior: acceptance and calibration", prior),
            ("section-generators", "Generators: utilisation and rollout timeline", generators),
            ("section-staleness", "Staleness", staleness),
            ("section-step-time", "Learner step time", step_time)]
