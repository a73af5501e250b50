"""One table of the training modes the benchmarks run on real actors (issue 44: it was
written three times): a mode's name -> its config overrides (``mode``, ``algo``, and where a
mode has its own, ``prior``), applied to a run's config by ``bench.harness.config_for``.

``bench.learning`` and ``bench.throughput`` run these (the same name is the same run); the
paired and per-rollout studies of ``bench.learning`` seed every training rollout on top
(``rollout.seeded``: a property of the study, not of the mode). ``bench.sim`` simulates
modes of the same names (``bench.sim.core.MODES`` says how each is simulated, beside modes
that only a simulated cluster has: colocated, over-sampled); tests/unit/test_sim.py checks
that a name both tables hold is the same mode in both (barrier or not, the algorithm).
"""
from __future__ import annotations

MODES = {
    "async_v05": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16}},
    "sync_grpo16": {"mode": "sync", "algo": {"name": "grpo", "k_init": 16, "k_max": 16}},
    **{f"async_grpo{G}": {"mode": "async", "algo": {"name": "grpo", "k_init": G, "k_max": G}}
       for G in (2, 4, 8, 16)},
    "sync_dapo16": {"mode": "sync", "algo": {"name": "dapo", "k_init": 16, "k_max": 16}},
    # bench.throughput: async GRPO at the G whose baseline MSE equals V0.5's (G set at run time
    # by the simulator calibrated on that run).
    "async_grpo_equal_mse": {"mode": "async", "algo": {"name": "grpo"}},
    # The budget rule's sweep (issue 18, item 5): what sets V0.5's extra rollouts.
    "async_v05_cost2x": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16,
                                                   "cost": 0.0078}},
    "async_v05_cost4x": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16,
                                                   "cost": 0.0156}},
    "async_v05_kmax8": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 8}},
    "async_v05_plugin": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16,
                                                   "lookahead": "plugin"}},
    # Uniform groups at zero advantage (the weak start's diagnosis: docs/benchmarks.md).
    "async_v05_zu": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16,
                                               "zero_uniform": True}},
    # The baseline study (issue 29): 4 trained samples per prompt in every mode.
    "async_drgrpo4": {"mode": "async", "algo": {"name": "dr_grpo", "k_init": 4, "k_max": 4}},
    "async_v05_k4": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 4}},
    "async_oracle4": {"mode": "async", "algo": {"name": "oracle", "k_init": 16, "k_max": 16,
                                                "train_k": 4}},
    # The paired baseline study (--baselines --paired): the same modes synchronous; the study
    # seeds every training rollout from (seed, admission, index) (rollout.seeded,
    # bench.learning's --paired): at one seed every mode starts on the same prompts with the
    # same responses, and differs by its baseline alone until the policies part (common
    # random numbers). sync_v05 is also bench.throughput's V0.5 behind the barrier (unseeded).
    **{f"sync_{name}": {**spec, "mode": "sync"}
       for name, spec in (("drgrpo4", {"algo": {"name": "dr_grpo", "k_init": 4, "k_max": 4}}),
                          ("oracle4", {"algo": {"name": "oracle", "k_init": 16, "k_max": 16,
                                                "train_k": 4}}),
                          ("v05", {"algo": {"name": "v05", "k_init": 4, "k_max": 16}}),
                          ("v05_k4", {"algo": {"name": "v05", "k_init": 4, "k_max": 4}}),
                          # the others' mean: Dr.GRPO-4's advantages x 4/3, the same baseline
                          # information (does the advantages' scale explain V0.5 at k = 4?)
                          ("rloo4", {"algo": {"name": "rloo", "k_init": 4, "k_max": 4}}))},
    # The per-rollout study (--selection, issue 41): synchronous, and seeded by the study like
    # the paired one, 4 rollouts per prompt to start; the baselines, and selection (algo.select: which
    # prompts get rollouts at all) on V0.5 and on Dr.GRPO-4. DAPO's dynamic sampling drops
    # all-equal groups after their rollouts (counted) and refills; GRESO-style skipping reads
    # a prompt's own last rewards (only where prompts recur).
    **{f"sync_{name}": {"mode": "sync", "algo": {"k_init": 4, "k_max": 4, **algo}}
       for name, algo in (("grpo4", {"name": "grpo"}), ("dapo4", {"name": "dapo"}),
                          ("js4", {"name": "james_stein"}),
                          ("v05_sel", {"name": "v05", "k_max": 16, "select": "prior"}),
                          ("v05_k4_sel", {"name": "v05", "select": "prior"}),
                          # the exploration floor, tried on the warm start only (0.1 above)
                          ("v05_k4_sel_floor03", {"name": "v05", "select": "prior",
                                                  "select_floor": 0.03}),
                          ("v05_k4_sel_floor30", {"name": "v05", "select": "prior",
                                                  "select_floor": 0.3}),
                          # the sharper rule: admitted where U < 0.3, else at the floor
                          # (studies.selection_limits: 0.60 of the uniform share, 48% admitted)
                          ("v05_k4_sel_t03", {"name": "v05", "select": "prior",
                                              "select_threshold": 0.3}),
                          ("drgrpo4_sel", {"name": "dr_grpo", "select": "prior"}),
                          ("greso4", {"name": "dr_grpo", "select": "history"}))},
    # V0.5 with the prior of 2026-12-03 (no surface view, every score weighed alike), beside
    # the shipped prior in the same study: what issue 29's second prior changed.
    "async_v05_prior1203": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16},
                            "prior": {"options": {"views": ["embedding", "ngram", "both"],
                                                  "weigh_rollouts": False}}},
}
