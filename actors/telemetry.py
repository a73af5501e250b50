"""Ray dashboard metrics (``ray.util.metrics``), names prefixed ``v05_``.

One tiny actor owns the metric objects; the driver reports each learner step's record
(``cluster.records.step.StepMetrics``) to it, so sync and async runs export the same series.
Ray's metrics agent serves them in Prometheus format (the dashboard's Grafana panels, or
``--metrics-export-port``).
"""
from __future__ import annotations

K_BOUNDARIES = [float(k) + 0.5 for k in range(1, 32)]  # one bucket per rollout count

GAUGES = {  # name -> (description, the step record's field)
    "v05_generator_busy_fraction": ("Fraction of time generators had work", "generator_busy_fraction"),
    "v05_inflight_prompts": ("Prompts admitted and not yet handed to the learner", "inflight_prompts"),
    "v05_prior_accept_rate": ("Fraction of prompts whose prior passed the test", "prior_accept_rate"),
    # The prior's error against the truth, noise-corrected, from each prompt's first k_init
    # rewards, pooled over the last 20 steps (cluster.records.metrics.PRIOR_WINDOW_STEPS): one step's
    # 16 prompts are too few for a steady series.
    "v05_prior_error_sd": ("Prior's noise-corrected error sd, sqrt E[(p - mu)^2], recent steps",
                           "prior_error_sd_corrected_window"),
    "v05_prior_bias": ("Prior's bias E[p - mu] (> 0: over-predicts success), recent steps",
                       "prior_bias_window"),
    "v05_staleness_mean": ("Mean policy-version lag of trained samples", "staleness_mean"),
    "v05_staleness_max": ("Largest policy-version lag of trained samples", "staleness_max"),
    "v05_learner_step_time_s": ("Wall time of one learner step (s)", "step_time_s"),
    "v05_learner_idle_fraction": ("Fraction of a step the learner waited for data", "learner_idle_fraction"),
    "v05_tokens_per_s": ("Generated tokens per second since the start", "tokens_per_s"),
    "v05_prompts_per_s": ("Trained prompts per second since the start", "prompts_per_s"),
    "v05_reward_mean": ("Mean reward of the trained batch", "reward_mean"),
    "v05_policy_version": ("Policy version the generators serve", "policy_version"),
}
ROLLOUTS_PER_PROMPT = "v05_rollouts_per_prompt"    # histogram: rollouts per finished prompt
EXTRA_ROLLOUTS = "v05_extra_rollouts_requested"    # counter: rollouts asked beyond k_init

# What Ray's Prometheus endpoint exports for each series (the prefix ``ray_``, and the
# suffixes Prometheus gives a histogram and a counter); cluster/grafana/v05_dashboard.json
# plots these.
EXPORTED = {**{name: (f"ray_{name}",) for name in GAUGES},
            ROLLOUTS_PER_PROMPT: tuple(f"ray_{ROLLOUTS_PER_PROMPT}_{s}"
                                       for s in ("bucket", "sum", "count")),
            EXTRA_ROLLOUTS: (f"ray_{EXTRA_ROLLOUTS}_total",)}


class Telemetry:
    def __init__(self, run_name: str = ""):
        from ray.util import metrics

        tags = {"run": run_name}
        self._gauges = {}
        for name, (desc, key) in GAUGES.items():
            g = metrics.Gauge(name, description=desc, tag_keys=("run",))
            g.set_default_tags(tags)
            self._gauges[key] = g
        self._k = metrics.Histogram(ROLLOUTS_PER_PROMPT, description="Rollouts per finished prompt",
                                    boundaries=K_BOUNDARIES, tag_keys=("run",))
        self._k.set_default_tags(tags)
        self._extra = metrics.Counter(EXTRA_ROLLOUTS,
                                      description="Rollouts requested beyond k_init", tag_keys=("run",))
        self._extra.set_default_tags(tags)

    def ready(self) -> bool:
        return True

    def report(self, step, ks: list[int]) -> None:
        """One learner step: ``step``, its record (a ``StepMetrics``: each gauge reads its field,
        none set where the step has no figure), and ``ks``, its trained prompts' rollouts."""
        for key, gauge in self._gauges.items():
            v = getattr(step, key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                gauge.set(float(v))
        for k in ks:
            self._k.observe(float(k))
        if step.extra_rollouts:
            self._extra.inc(float(step.extra_rollouts))
