"""The prior's variants that ``studies.prior_truth`` measures beside the shipped one, on the
same contexts and truth: each its options, merged over the run's ``prior.options``."""

VARIANTS = {"shipped": {}, "no_drift": {"drift": False},
            "drift_lead0": {"drift": True, "lead": 0.0},
            "drift_lead1": {"drift": True, "lead": 1.0},
            "drift_lead2": {"drift": True, "lead": 2.0},
            "drift_lead1_halflife16": {"drift": True, "lead": 1.0, "halflife": 16.0},
            "halflife4": {"halflife": 4.0},
            # the prior before issue 29: the sentence embedding alone, no same-prompt term
            "embedding_only": {"views": ["embedding"], "same_prompt": False, "select": "loo"},
            # the prior of 2026-12-03: no surface view, every score weighed alike
            "no_surface_unweighted": {"views": ["embedding", "ngram", "both"],
                                      "weigh_rollouts": False, "select": "loo",
                                      "link": "identity"},
            "no_surface": {"views": ["embedding", "ngram", "both"]},
            "unweighted": {"weigh_rollouts": False},
            # each score weighed by its count, not its inverse variance about the window
            # (the default until 2026-12-05, night)
            "count_weighted": {"weigh_rollouts": "count"},
            # the kernel model chosen by leave-one-out error, not by its evidence
            "loo": {"select": "loo"},
            # every column of the surface view, none chosen
            "all_columns": {"columns": "all"},
            # the prior until 2026-12-05: leave-one-out, every surface column (the runs
            # measured here were made with it: their --run-variant)
            "until_2026_12_05": {"select": "loo", "columns": "all", "link": "identity",
                                 "weigh_rollouts": "count"},
            # a radial-basis kernel offered beside the linear one (one more eigh per view)
            "rbf": {"kernels": ["linear", "rbf"]},
            # a recurring prompt's history at face value only, not as its offset from the
            # model (the prior before the offset form)
            "history_level": {"same_prompt": "level"},
            # the prior until 2026-12-05, evening (the runs of that day were made with it):
            # the fit on the probabilities alone, each score weighed by its count
            "identity_link": {"link": "identity", "weigh_rollouts": "count"},
            # the fit on the probabilities alone, on the scores' empirical logits alone
            "probability_scale": {"link": "identity"}, "logit_link": {"link": "logit"}}
