"""The stepwise task's embedded policy: warm-started on correct traces mixed with slipped ones.

Supervised training (teacher forcing, loss on the completion and EOS) on an endless stream of
train-side problems whose traces slip at ``slip_rate`` per step (``tasks.stepwise.
sample_trace``). The model learns the procedure (greedy decoding solves nearly every
held-out problem) and, imitating the data, samples a slip at about that rate: its sampled
accuracy starts in a middle range that falls with the number of steps, and RL can raise it by
making the correct step reliable. Registered in ``tasks.policy.POLICIES``.

The first ``clean_frac`` of the steps train on correct traces only, the rest on the slipped
mixture. Batches hold about ``batch_tokens`` tokens (padding included): ``pool`` examples are
sorted by length and cut into batches, so that short and long traces do not pad each other.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import asdict

from tasks import stepwise
from tasks.base import Problem
from tasks.policy_model import DEFAULT_ARCH, EOS, vocab
from tasks.warm_start import collate, train  # noqa: F401 - collate: shared, named here too

# Every constant that changes the built weights (hashed with ARCH and facts()); bump `version`
# when the training code changes. Measured in docs/task.md.
RECIPE = dict(
    version=1,
    seed=1,
    steps=1400,
    batch_tokens=1024,
    pool=2048,
    lr=5e-4,
    warmup_steps=30,
    # Constant lr, then a linear decay over the last `decay_frac` of the steps down to
    # `final_lr_frac` * lr. The per-step arithmetic is learned late and suddenly; with this lr
    # and ARCH's initializer_range it is learned by about step 700, while lr 1e-3 (init 0.02)
    # left 20% of held-out traces wrong after 1400 steps, and 2e-3 stalled until the lr decayed.
    decay_frac=0.25,
    final_lr_frac=0.05,
    betas=[0.9, 0.98],
    weight_decay=0.01,
    slip_rate=0.12,
    # The first `clean_frac` of the steps train on correct traces only: the per-step
    # arithmetic is learned sooner without slips (docs/task.md), and the rest of the steps
    # teach the slips.
    clean_frac=0.5,
    difficulties=[1, 2, 3, 4],
    threads=1,
)
# Room for the prompt (<= 9 tokens) and a long sampled trace: the longest correct one is
# stepwise.MAX_TRACE_CHARS (241) + EOS. Rotary positions: the size of this costs nothing.
# A wider initialisation than Llama's 0.02 starts the per-step arithmetic sooner.
ARCH = {**DEFAULT_ARCH, "max_position_embeddings": 512, "initializer_range": 0.05}
# The response budget a generator should allow: the longest correct trace, a repeated
# step, EOS, and a little slack for sampled ones.
MAX_TOKENS = 288


def facts() -> dict:
    """The task's side of the recipe hash: what the traces are made of."""
    return dict(task=stepwise.StepwiseTask.name,
                levels={k: asdict(v) for k, v in stepwise.LEVELS.items()},
                modulus=stepwise.MODULUS, step_sizes=list(stepwise.STEP_SIZES),
                ops=stepwise.OPS, slips=list(stepwise.SLIPS), answer=stepwise.ANSWER_PREFIX,
                split=[stepwise.SPLIT_SALT, stepwise.HELDOUT_FRACTION])


def examples(problems: Iterator[Problem], slip_rate: float,
             rng: random.Random) -> Iterator[tuple[list[int], list[int]]]:
    """(input ids, labels) of prompt + trace (slipping at ``slip_rate``) + EOS; labels are
    -100 on the prompt."""
    v = vocab()
    for p in problems:
        trace, _ = stepwise.sample_trace(stepwise.parse_prompt(p.prompt), rng, slip_rate)
        prompt = [v[c] for c in p.prompt]
        completion = [v[c] for c in trace] + [v[EOS]]
        yield prompt + completion, [-100] * len(prompt) + completion


def bucketed(source: Iterator, recipe: dict, rng: random.Random) -> Iterator[list]:
    """Batches of about ``batch_tokens`` padded tokens: ``pool`` examples sorted by length,
    cut into batches, shuffled."""
    while True:
        pool = sorted((next(source) for _ in range(recipe["pool"])), key=lambda e: len(e[0]))
        out, cur = [], []
        for ex in pool:  # sorted: the newest example is the longest of the batch
            if cur and (len(cur) + 1) * len(ex[0]) > recipe["batch_tokens"]:
                out.append(cur)
                cur = []
            cur.append(ex)
        out.append(cur)
        rng.shuffle(out)
        yield from out


def batches(recipe: dict) -> Iterator[list[tuple[list[int], list[int]]]]:
    """The warm start's batches in order: ``clean_frac * steps`` of correct traces, then
    traces that slip at ``slip_rate``; one seeded stream of train-side problems."""
    problems = stepwise.train_stream(recipe["seed"], recipe["difficulties"])
    rng = random.Random(f"stepwise-warm-start-{recipe['seed']}")
    clean = bucketed(examples(problems, 0.0, rng), recipe, rng)
    for _ in range(round(recipe["clean_frac"] * recipe["steps"])):
        yield next(clean)
    yield from bucketed(examples(problems, recipe["slip_rate"], rng), recipe, rng)


def lr_at(step: int, recipe: dict) -> float:
    """Linear warmup, constant, then a linear decay over the last ``decay_frac`` of the steps."""
    warm = (step + 1) / recipe["warmup_steps"]
    decay = (recipe["steps"] - step) / (recipe["decay_frac"] * recipe["steps"])
    return recipe["lr"] * min(1.0, warm, max(recipe["final_lr_frac"], decay))


def warm_start(model, recipe: dict, log: Callable[[str], None]) -> float:
    """AdamW with teacher forcing on ``batches(recipe)`` (``tasks.warm_start.train``);
    returns the last (smoothed) loss."""
    return train(model, recipe, batches(recipe), lr_at, log, loss_weight=0.05,
                 betas=tuple(recipe["betas"]))
