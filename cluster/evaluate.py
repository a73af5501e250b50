"""Evaluate a model, or a run's trained policy, without training: the same vLLM engine, prompt
rendering and graders as a run.

    python -m cluster.evaluate MODEL_OR_RUN [--data FILE] [-n N] [--k 1,4,8] [--temperature T]
                               [--max-tokens M] [--prompts P] [--generators G] [--seed S]
                               [--config FILE] [--out FILE.json] [overrides ...]

MODEL_OR_RUN is a model (a checkpoint directory, a Hugging Face id in the local cache, a
packaged name such as ``smollm2-135m-instruct``, ``embedded``) evaluated with ``--config``'s
settings (default v05.yaml), or a run directory, evaluated with its own ``config.yaml`` on its
trained policy (``final/``). ``--data FILE`` is a dataset as the math task reads one (verl's
parquet layout, JSON lines, ...; ``task.prompt_key``/``task.answer_key``/``task.grading``/
``task.grading_by_source``/``task.reward_function`` apply); without it, the config's task's
held-out split. Every prompt gets one greedy answer and N sampled ones (default: the config's
``run.eval_samples`` at ``rollout.temperature``, ``rollout.max_tokens``; sample i of prompt x
seeded from (``--seed``, x's id) as a run's evaluation seeds them, so a run's own evaluation
at the same settings is reproduced). Prints a progress line and a table of mean@N, pass@k
(unbiased), maj@k and greedy, overall and per ``data_source``, each with its standard error
over prompts (``cluster/records/scores.py``), and writes them to ``--out`` (JSON).

Runs on a Ray cluster of its own on 127.0.0.1, or joins the configured one; only generators
start. Exit status 2 on a bad request (config, model, data), before any actor starts.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m cluster.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_or_run", help="a model path or name, or a run directory")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    ap.add_argument("--data", help="a dataset file (default: the task's held-out split)")
    ap.add_argument("-n", type=int, help="sampled answers per prompt (default run.eval_samples)")
    ap.add_argument("--k", default="1,4,8", help="the k of pass@k and maj@k (those <= n)")
    ap.add_argument("--temperature", type=float, help="default rollout.temperature")
    ap.add_argument("--max-tokens", type=int, help="default rollout.max_tokens")
    ap.add_argument("--prompts", type=int, help="the first P prompts only")
    ap.add_argument("--generators", type=int, help="engines (default generators.count)")
    ap.add_argument("--seed", type=int, help="sampling seed base (default run.seed)")
    ap.add_argument("--config", default="v05.yaml", help="settings for a model (not a run)")
    ap.add_argument("--out", help="the JSON file to write (default: none)")
    return ap.parse_intermixed_args(argv)  # overrides before or after the options


def resolve(args):
    """(config, model path, problems, the config of the task that grades them), or
    ValueError (ConfigError, PreflightError)."""
    from cluster.config.schema import load_config
    from tasks import TaskConfig, make_task_from_config
    from tasks.math_task import load_problems

    run = Path(args.model_or_run)
    logs = [f"run.output_dir={tempfile.mkdtemp(prefix='v05-evaluate-')}", "run.name=evaluate"]
    if (run / "config.yaml").is_file() and (run / "final").is_dir():
        cfg = load_config(run / "config.yaml", [*logs, *args.overrides])
        model = str((run / "final").resolve())
    else:
        cfg = load_config(args.config, [*logs, f"model.path={args.model_or_run}",
                                        *args.overrides])
        model = cfg.model_path()
    from cluster.config.preflight import check_model
    check_model(model)
    if args.data:
        t = cfg.task
        task_cfg = TaskConfig(name="math", path=args.data, n_heldout=1, prompt_key=t.prompt_key,
                              answer_key=t.answer_key, grading=t.grading,
                              grading_by_source=t.grading_by_source,
                              reward_function=t.reward_function, reward_low=t.reward_low,
                              reward_high=t.reward_high)
        make_task_from_config(task_cfg)  # its grader builds (a reward function loads)
        problems = load_problems(args.data, t.prompt_key, t.answer_key)
    else:
        task_cfg = cfg.task
        problems = make_task_from_config(task_cfg).heldout()
    return cfg, model, problems[:args.prompts] if args.prompts else problems, task_cfg


@contextlib.contextmanager
def running_generators(cfg, model: str, count: int):
    """``count`` generators (the config's engine settings) on the cluster ``connect`` joins
    or starts, for the ``with`` block: their handles; after it they are stopped, their
    placement groups released, and Ray shut down if this process started it."""
    import ray

    from cluster.nodes.placement import release

    handles, groups, started = start_generators(cfg, model, count)
    try:
        yield handles
    finally:
        for h in handles:
            ray.kill(h, no_restart=True)
        release(groups)
        if started:
            ray.shutdown()


def start_generators(cfg, model: str, count: int) -> tuple[list, dict, bool]:
    """``count`` generators (the config's engine settings) on the cluster ``connect`` joins
    or starts; (handles, placement groups, whether this process started Ray)."""
    import ray

    from cluster.nodes.connect import connect
    from cluster.nodes.placement import Plan, RolePlan, group_key, reserve
    from cluster.nodes.roles import start_generator
    from common.names import actor_name

    g = cfg.generators
    plan = Plan((RolePlan("generator", count, g.cpus, g.gpus),))
    started = connect(cfg, plan)
    groups = reserve(plan)
    handles = [start_generator(cfg, model, i, groups[group_key("generator", i)],
                               actor_name(f"evaluate-{time.time_ns()}", f"generator-{i}"))
               for i in range(count)]
    ray.get([h.ready.remote() for h in handles])
    return handles, groups, started


def answer(generators, problems, n: int, temperature: float, max_tokens: int, seed: int,
           progress) -> tuple[list, dict]:
    """Every request of ``cluster.run.evaluation.eval_requests`` run over the generators
    (``spread``: a lost one's requests go to the others); (requests, {request: rollouts})."""
    import ray

    from cluster.run.evaluation import eval_requests, spread

    requests = eval_requests(problems, max_tokens, n, temperature, seed, prefix="evaluate")
    done = [0]

    def get(ref):
        out = ray.get(ref)
        done[0] += 1
        progress(done[0], len(requests))
        return out

    def wait(refs, timeout):
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        return ray.wait(refs, num_returns=len(refs), timeout=0)[0] if ready else []

    results, skipped, lost = spread(
        len(requests), len(generators),
        lambda g, i: generators[g].generate.remote(requests[i][2]), wait, get, 600.0)
    if skipped:
        raise RuntimeError(f"{len(skipped)} requests found no generator (lost: {lost})")
    return requests, results


def grade(task_cfg, requests, results, workers: int, timeout_s: float) -> list:
    """Each prompt's ``PromptAnswers`` (scores.py) from the graded answers, in prompt order,
    scored as a run scores (``reward.workers`` processes, each building the task)."""
    import functools

    from actors.scoring import Scorer
    from cluster.records.scores import PromptAnswers
    from tasks import make_task_from_config

    task = make_task_from_config(task_cfg)
    scorer = Scorer(task, functools.partial(make_task_from_config, task_cfg), workers,
                    timeout_s)
    jobs = [(i, r) for i in sorted(results) for r in results[i]]

    async def all_verdicts():
        return await asyncio.gather(*(scorer.score(requests[i][0], r.text, 0) for i, r in jobs))

    try:
        verdicts = asyncio.run(all_verdicts())
    finally:
        scorer.close()
    by_prompt: dict[str, PromptAnswers] = {}
    high = task.rewards[1]
    for (i, _), v in zip(jobs, verdicts):
        p, kind, _ = requests[i]
        a = by_prompt.setdefault(p.id, PromptAnswers(p.source))
        if kind == "greedy":
            a.greedy = v.reward == high
        else:
            a.correct.append(v.reward == high)
            a.read.append(v.extracted if v.parsed else None)
    order = dict.fromkeys(p.id for p, _, _ in requests)
    return [by_prompt[pid] for pid in order if pid in by_prompt]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from common.rayproc import no_auto_init, prefer_loopback

    prefer_loopback("local")
    try:
        cfg, model, problems, task_cfg = resolve(args)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    n = cfg.run.eval_samples if args.n is None else args.n
    temperature = cfg.rollout.temperature if args.temperature is None else args.temperature
    max_tokens = args.max_tokens or cfg.rollout.max_tokens
    seed = cfg.run.seed if args.seed is None else args.seed
    ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    from cluster.records.scores import by_source, table

    no_auto_init()
    t0 = time.time()

    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"  answered {done}/{total} requests ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    with running_generators(cfg, model, args.generators or cfg.generators.count) as generators:
        print(f"{len(problems)} prompts x (1 greedy + {n} sampled at T = {temperature:g}, "
              f"{max_tokens} tokens) on {len(generators)} generator(s) of {model}",
              file=sys.stderr, flush=True)
        requests, results = answer(generators, problems, n, temperature, max_tokens, seed,
                                   progress)
    if args.data:  # a dataset file is the math task's: its grader may need workers
        cfg = cfg.model_copy(update={"task": task_cfg})
    graded = grade(task_cfg, requests, results, cfg.score_workers(), cfg.reward.timeout_s)
    result = by_source(graded, ks)
    print(table(result))
    if args.out:
        out = {"command": "python -m cluster.evaluate " + " ".join(argv),
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "model": model, "data": args.data or f"{cfg.task.name} held-out split",
               "settings": {"n": n, "k": ks, "temperature": temperature,
                            "max_tokens": max_tokens, "seed": seed, "prompts": len(problems)},
               "figures": result, "wall_s": time.time() - t0}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from common.rayproc import run_main

    run_main(main)
