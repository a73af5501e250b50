"""Proxy instruction-performance data for the prior benchmark (python -m bench.prior); no download.

Two prompt families with a latent difficulty d(x), and a simulated RL run over them: at step t
the policy solves x with p_t(x) = sigmoid(a_t + g_t[topic(x)] - d(x)), where a_t rises over the
run (the policy improves) and g_t is a per-topic random walk (it improves unevenly, so old
observations go stale). Each step draws B fresh prompts and observes k rollouts of each.

- ``arithmetic``: the project's synthetic task (tasks.arithmetic), difficulty = level + noise.
- ``word``: math word problems written from templates over ten topics (shopping to olympiad
  algebra) inside a DAPO-like instruction wrapper; difficulty = topic + template + modifiers
  (multi-step clauses, exact-form requests, larger numbers) + per-prompt noise that no text
  feature can see. Lengths overlap across topics, so length alone does not rank them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from cluster.records.metrics import pair_auc  # noqa: F401 - public here too (bench.prior)

WRAP = ("Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        "problem.\n\n{}\n\nRemember to put your answer on its own line after \"Answer:\".")
NAMES = ["Ava", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
         "Kira", "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tara"]
ITEMS = ["notebook", "apple", "pencil", "ticket", "sandwich", "marble", "book", "mug", "plant"]

# topic -> (base difficulty, templates). A template is (offset, text); slots: {n} name,
# {i} item, {a}..{e} numbers drawn per prompt (see _numbers).
TOPICS: dict[str, tuple[float, list[tuple[float, str]]]] = {
    "shopping": (-2.2, [
        (0.0, "{n} buys {a} {i}s at ${b} each and pays with a ${c}00 bill. How much change does {n} receive?"),
        (0.3, "A shop sells {i}s in packs of {a}. {n} needs {c}{b} {i}s. How many packs must {n} buy?"),
        (0.5, "{n} spent {b}% of the savings on a {i} and then ${a} on lunch, leaving ${c}0. How much were the savings?")]),
    "rates": (-0.8, [
        (0.0, "A train travels {a}0 km in {b} hours. At the same speed, how far does it go in {c} hours?"),
        (0.6, "One pipe fills a tank in {a} hours and another in {b} hours. Working together, how long do they take to fill the tank?"),
        (0.9, "{n} rows upstream {a} km in {b} hours and back downstream in {c} hours. What is the speed of the current?")]),
    "percent": (-0.9, [
        (0.0, "A {i} costs ${a}0. Its price is raised by {b}%. What is the new price?"),
        (0.5, "The price of a {i} rises by {b}% and then falls by {c}%. By what percent did the price change overall?"),
        (0.8, "A solution is {b}% salt. How many litres of water must be added to {a} litres of it to make a {d}% solution?")]),
    "algebra": (-0.3, [
        (0.0, "Solve for x: {a}x + {b} = {c}x - {d}."),
        (0.4, "{n} is {a} times as old as a cousin. In {b} years {n} will be twice as old as the cousin. How old is {n} now?"),
        (0.7, "Find all real x with x^2 - {a}x + {b} = 0 and give the sum of their squares.")]),
    "geometry": (0.3, [
        (0.0, "A rectangle has perimeter {a}0 cm and one side of length {b} cm. What is its area?"),
        (0.5, "A right triangle has legs {a} and {b}. Find the radius of its inscribed circle."),
        (1.0, "A regular hexagon is inscribed in a circle of radius {a}. A square is inscribed in the same circle. Find the ratio of the hexagon's area to the square's area.")]),
    "sequences": (0.6, [
        (0.0, "The arithmetic sequence starts {a}, {a}+{b}, ... What is its {c}th term?"),
        (0.6, "A sequence satisfies a_1 = {a} and a_(n+1) = {b} a_n - {c}. Find a_{d}."),
        (1.0, "Find the sum of the first {c}0 terms of the sequence whose nth term is 1/(n(n+{a})).")]),
    "counting": (1.0, [
        (0.0, "How many ways can {a} different books be arranged on a shelf?"),
        (0.6, "In how many ways can {c} people sit around a round table if two particular people refuse to sit next to each other?"),
        (1.1, "How many {a}-digit positive integers have digits that sum to {c}{b}?")]),
    "probability": (1.2, [
        (0.0, "Two fair dice are rolled. What is the probability that the sum is {a}?"),
        (0.7, "A bag holds {a} red and {b} blue marbles. Three are drawn without replacement. What is the probability that exactly two are red?"),
        (1.2, "A fair coin is tossed {c}{a} times. What is the probability that no two consecutive tosses are both heads?")]),
    "number theory": (1.6, [
        (0.0, "What is the remainder when {a}{b}{c} is divided by {d}?"),
        (0.6, "Find the remainder when {a}^{c}{b} is divided by {d}{e}."),
        (1.2, "Find the smallest positive integer n such that n^2 + {a} is divisible by {d}{e} and n is odd.")]),
    "olympiad": (2.6, [
        (0.0, "Let f be a function from the reals to the reals with f(x + y) = f(x) + f(y) + {a}xy and f(1) = {b}. Find f({c})."),
        (0.6, "Positive reals x, y, z satisfy x + y + z = {a}. Find the minimum of 1/x + {b}/y + {c}/z."),
        (1.2, "Determine the number of ordered pairs of integers (m, n) with m^2 + {a}n^2 = {c}{b}{d} and m, n not both even.")]),
}
MODIFIERS = [(0.35, " Express your answer as a common fraction."),
             (0.45, " Give the answer in simplest radical form."),
             (0.5, " Then add {e} to the result and multiply by {a}; report the final value."),
             (0.3, " Justify every step and give an exact answer.")]


@dataclass(frozen=True)
class ProxyPrompt:
    prompt: str
    difficulty: float
    topic: str


def _numbers(rng: random.Random, big: bool) -> dict[str, int]:
    hi = 999 if big else 12
    return {k: rng.randint(2, hi) for k in "abcde"}


def word_problems(n: int, seed: int = 0) -> list[ProxyPrompt]:
    """``n`` distinct wrapped word problems with latent difficulty (see module docstring)."""
    rng = random.Random(f"word-{seed}")
    out: dict[str, ProxyPrompt] = {}
    topics = list(TOPICS)
    while len(out) < n:
        topic = rng.choice(topics)
        base, templates = TOPICS[topic]
        offset, text = rng.choice(templates)
        big = rng.random() < 0.3
        nums = _numbers(rng, big)
        mods = [m for m in MODIFIERS if rng.random() < 0.2]
        body = text + "".join(t for _, t in mods)
        body = body.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), **nums)
        d = base + offset + sum(o for o, _ in mods) + (0.4 if big else 0.0) + rng.gauss(0.0, 0.8)
        prompt = WRAP.format(body)
        out.setdefault(prompt, ProxyPrompt(prompt, d, topic))
    return list(out.values())


def arithmetic_problems(n: int, seed: int = 0) -> list[ProxyPrompt]:
    """``n`` distinct train-side prompts of tasks.arithmetic; difficulty = level + noise."""
    from tasks.arithmetic import train_stream
    level_d = {1: -2.0, 2: -0.6, 3: 0.2, 4: 1.6}
    rng = random.Random(f"arith-{seed}")
    out: dict[str, ProxyPrompt] = {}
    for prob in train_stream(seed):
        if prob.prompt not in out:
            d = level_d[prob.difficulty] + rng.gauss(0.0, 0.6)
            out[prob.prompt] = ProxyPrompt(prob.prompt, d, f"level{prob.difficulty}")
        if len(out) >= n:
            break
    return list(out.values())


@dataclass(frozen=True)
class Step:
    """One training step: prompts (B,), true success probabilities (B,), observed rates (B,)."""

    version: int
    prompts: list[str]
    true_p: np.ndarray
    observed: np.ndarray


def simulate_run(pool: list[ProxyPrompt], steps: int, batch: int, k: int = 8, seed: int = 0,
                 drift: float = 0.15, gain: float = 1.5) -> list[Step]:
    """``steps`` steps of ``batch`` fresh prompts each (no prompt repeats: len(pool) must be
    >= steps * batch), success rates observed from ``k`` Bernoulli rollouts."""
    if len(pool) < steps * batch:
        raise ValueError(f"pool of {len(pool)} prompts is smaller than {steps} x {batch}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    topics = sorted({p.topic for p in pool})
    g = {t: rng.normal(0.0, 0.3) for t in topics}
    out = []
    for t in range(steps):
        a_t = -0.3 + gain * t / max(steps - 1, 1)
        chosen = [pool[i] for i in order[t * batch:(t + 1) * batch]]
        logits = np.array([a_t + g[p.topic] - p.difficulty for p in chosen])
        true_p = 1.0 / (1.0 + np.exp(-logits))
        observed = rng.binomial(k, true_p) / k
        out.append(Step(t, [p.prompt for p in chosen], true_p, observed))
        for topic in topics:
            g[topic] += rng.normal(0.0, drift)
    return out


