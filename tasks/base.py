"""The task interface: problems, verdicts, and a binary-reward verifier contract.

Pure Python (no torch / vLLM import) so that the coordinator and tests can score completions
without the ML stack. A task hands out two disjoint problem lists (train, held-out) and scores
one completion at a time.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tasks.splits import check_levels


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer. ``difficulty`` is a task-specific level (0 = unknown).

    ``messages``: the chat turns, (role, content) pairs, of a dataset prompt that is a
    conversation other than one user turn (e.g. a system turn first); generators with a chat
    template render those turns. Empty for a plain prompt: ``prompt`` is then the user turn.
    With turns, ``prompt`` is their contents joined by a blank line (the prompt's identity in
    records and splits, and what a model without a chat template reads)."""

    id: str
    prompt: str
    answer: str
    difficulty: int = 0
    messages: tuple[tuple[str, str], ...] = ()
    source: str = ""  # the dataset row's data_source (verl's column): picks its grader
    extra: str = ""   # the row's extra_info as JSON text (a reward function's extra_info)

    def __post_init__(self):  # lists after a checkpoint's round trip: tuples, so it hashes
        object.__setattr__(self, "messages", tuple(tuple(m) for m in self.messages))


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one completion.

    ``parsed`` is False when no answer could be extracted; the reward is then ``r_lo``
    (callers count unparsed completions as a metric). ``extracted`` is the answer string the
    verifier compared, or None when nothing was found.
    """

    reward: float
    parsed: bool
    extracted: str | None
    extras: tuple = ()  # (name, value) pairs a reward function returned beside its score


def check_rewards(reward_low: float, reward_high: float) -> tuple[float, float]:
    """A task's binary reward pair (r_lo, r_hi), by the estimator's rule (finite, r_lo < r_hi:
    its noise bound needs a range); the one check every task and ``TaskConfig`` use."""
    from estimator.core import check_rewards as estimator_rule

    try:
        return estimator_rule((reward_low, reward_high))
    except ValueError:
        raise ValueError(f"reward_low ({reward_low}) must be smaller than reward_high "
                         f"({reward_high}), both finite") from None


class Task(ABC):
    """A dataset plus a binary verifier: reward ``r_hi`` if the answer is correct, else ``r_lo``.

    Subclasses implement ``train``, ``heldout``, ``extract`` (completion -> answer string or
    None) and ``is_correct`` (extracted answer vs problem -> bool, or None when the extracted
    string cannot be interpreted). ``score`` combines them and is the only method callers use.
    """

    name: str = "task"
    # What ``extract`` reads as the final answer, in words (said when few answers parse)
    answer_format: str = "a final answer"

    def __init__(self, reward_low: float = -1.0, reward_high: float = 1.0):
        self.rewards: tuple[float, float] = check_rewards(reward_low, reward_high)

    @abstractmethod
    def train(self) -> list[Problem]:
        """The training problems (disjoint from ``heldout()``)."""

    @abstractmethod
    def heldout(self) -> list[Problem]:
        """The held-out evaluation problems (disjoint from ``train()``)."""

    @abstractmethod
    def extract(self, completion: str) -> str | None:
        """The final answer written in ``completion``, or None if there is none."""

    @abstractmethod
    def is_correct(self, problem: Problem, extracted: str) -> bool | None:
        """Whether ``extracted`` answers ``problem``; None if it cannot be interpreted at all."""

    def answer_of(self, problem: Problem, completion: str) -> str | None:
        """The final answer of ``completion`` as ``problem`` is graded (a task whose graders
        differ by problem reads it with the problem's); by default ``extract``."""
        return self.extract(completion)

    def score(self, problem: Problem, completion: str) -> Verdict:
        r_lo, r_hi = self.rewards
        extracted = self.answer_of(problem, completion)
        if extracted is None:
            return Verdict(reward=r_lo, parsed=False, extracted=None)
        ok = self.is_correct(problem, extracted)
        if ok is None:
            return Verdict(reward=r_lo, parsed=False, extracted=extracted)
        return Verdict(reward=r_hi if ok else r_lo, parsed=True, extracted=extracted)


class GeneratedTask(Task):
    """A task whose problems a seeded generator draws (``build_split``): ``n_train`` train and
    ``n_heldout`` held-out problems at the given difficulty levels (of ``levels``, the task's
    level table), each split built once, on first use. Subclasses set ``name``, ``levels``,
    ``default_n_train``, ``build_split`` and ``extract``; an answer is right when it is the
    reference number (``is_correct``)."""

    levels: Mapping[int, object]
    default_levels: tuple[int, ...] | None = None  # drawn when none are given; None: all
    default_n_train: int
    build_split: Callable[[int, int, Sequence[int], bool], list[Problem]]

    def __init__(self, seed: int = 0, n_train: int | None = None, n_heldout: int = 200,
                 difficulties: Sequence[int] | None = None,
                 reward_low: float = -1.0, reward_high: float = 1.0):
        super().__init__(reward_low, reward_high)
        n_train = self.default_n_train if n_train is None else n_train
        if n_train < 1 or n_heldout < 1:
            raise ValueError(f"n_train and n_heldout must be >= 1, got {n_train}, {n_heldout}")
        self.seed, self.n_train, self.n_heldout = seed, n_train, n_heldout
        self.difficulties = self.check_difficulties(
            tuple(self.default_levels or self.levels) if difficulties is None else difficulties)
        self._splits: dict[bool, list[Problem]] = {}

    @classmethod
    def check_difficulties(cls, difficulties: Sequence[int]) -> tuple[int, ...]:
        """``difficulties`` as a tuple of distinct levels of this task, else ValueError."""
        return check_levels(difficulties, cls.levels)

    def is_correct(self, problem: Problem, extracted: str) -> bool:
        return float(extracted) == float(problem.answer)

    def _split(self, heldout: bool) -> list[Problem]:
        if heldout not in self._splits:
            n = self.n_heldout if heldout else self.n_train
            self._splits[heldout] = type(self).build_split(self.seed, n, self.difficulties,
                                                           heldout=heldout)
        return list(self._splits[heldout])

    def train(self) -> list[Problem]:
        return self._split(False)

    def heldout(self) -> list[Problem]:
        return self._split(True)
