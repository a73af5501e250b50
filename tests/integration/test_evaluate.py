"""``python -m cluster.evaluate`` on the real model's held-out set (SmolLM2-135M-Instruct,
configs/smollm2-135m.yaml, on the CPU), against a training run's own evaluation of the same
weights at the same settings: on one real vLLM engine, the run's ``evaluate`` (what a run
reports as eval_sampled and eval_greedy) and the command's answering and grading draw the same
seeded answers, so mean@n and greedy must be equal, not merely within SE."""
import sys

import pytest

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")


def test_cluster_evaluate_reproduces_a_runs_own_evaluation_on_the_real_model(tmp_path):
    from cluster.evaluate import answer, grade, parse_args, resolve, running_generators
    from cluster.records.scores import by_source
    from cluster.run.evaluation import evaluate
    from tasks import make_task_from_config

    args = parse_args(["smollm2-135m-instruct", "--config", "configs/smollm2-135m.yaml",
                       "--prompts", "16", "cluster.address=local", "generators.count=1"])
    cfg, model, problems, task_cfg = resolve(args)
    n, t, m = cfg.run.eval_samples, cfg.rollout.temperature, cfg.rollout.max_tokens
    with running_generators(cfg, model, 1) as gens:
        run_eval = evaluate(gens, make_task_from_config(task_cfg), problems, m, n, t,
                            seed=cfg.run.seed)
        requests, results = answer(gens, problems, n, t, m, cfg.run.seed,
                                   lambda done, total: None)
    figures = by_source(grade(task_cfg, requests, results, 0, 10.0), [1, 4])["all"]
    print(f"cluster.evaluate on {len(problems)} held-out prompts: {figures}", file=sys.stderr)
    assert figures["prompts"] == len(problems) == 16 and figures["n"] == n == 4
    assert figures[f"mean@{n}"]["mean"] == pytest.approx(run_eval.sampled)
    assert figures[f"mean@{n}"]["se"] == pytest.approx(run_eval.sampled_se)
    assert figures["greedy"]["mean"] == pytest.approx(run_eval.greedy)
    assert figures["pass@4"]["mean"] >= figures["pass@1"]["mean"]
