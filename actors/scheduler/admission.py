"""The scheduler's admission calendar (package docstring: "Staleness by deadline"): each
deadline's quota of admissions, the refills a deadline took, the deadlines of the batch the
learner took, and the mean k that sizes the quota under ``batch_samples``. An object the
``Scheduler`` holds and tells what happened; it reads nothing of the scheduler's."""
from __future__ import annotations

from collections import Counter, deque
from typing import Callable

RECENT_K = 64  # finished prompts whose mean k sizes the quota under ``batch_samples``


class AdmissionCalendar:
    def __init__(self, cfg):
        """``cfg``: the ``SchedulerConfig`` (batch_prompts, batch_samples, max_staleness,
        max_refill_factor)."""
        self.cfg = cfg
        self.quota: Counter = Counter()    # deadline -> admissions given it (not returned
                                           # when trained early)
        self.refills: Counter = Counter()  # deadline -> prompts dropped (filtered) at it
        self.taken: int | None = None      # the version whose batch the learner took
        self.last_batch: list[int] = []    # the deadlines of that batch's prompts
        self.recent_k: deque[int] = deque(maxlen=RECENT_K)  # newest finished's ``trainable``
        self.extra: Counter = Counter()    # deadline -> admissions past B (``top_up``)

    @property
    def quota_size(self) -> int:
        """B: prompts per deadline. With ``batch_samples`` S, S over the mean trainable
        samples (k, but for the oracle) of the newest finished prompts (``batch_prompts``
        before any has finished)."""
        S = self.cfg.batch_samples
        if S is None or not self.recent_k:
            return self.cfg.batch_prompts
        return max(1, round(S / (sum(self.recent_k) / len(self.recent_k))))

    def open_deadlines(self, version: int) -> list[int]:
        """Deadlines that take new prompts: the window [V, V + max_staleness], less deadline V
        once the learner took its batch there (until it reports back), less any deadline
        whose filtered-and-refilled prompts ran over ``max_refill_factor`` x B (a policy that
        solves or fails everything would refill forever; the batch then trains short)."""
        cap = self.cfg.max_refill_factor * self.quota_size
        first = version + (self.taken == version)
        return [d for d in range(first, version + self.cfg.max_staleness + 1)
                if self.refills[d] < cap]

    def size(self, deadline: int) -> int:
        """The admissions ``deadline`` takes: B, and any ``top_up`` it was given."""
        return self.quota_size + self.extra[deadline]

    def room(self, version: int) -> int:
        """Prompts the open deadlines' quotas still take."""
        return sum(max(0, self.size(d) - self.quota[d]) for d in self.open_deadlines(version))

    def admit(self, version: int) -> int:
        """A prompt admitted now: the earliest open deadline with quota left, counted."""
        d = next(d for d in self.open_deadlines(version) if self.quota[d] < self.size(d))
        self.quota[d] += 1
        return d

    def top_up(self, deadline: int, missing: int, least: int) -> None:
        """More admissions for ``deadline``: its sample-counted batch is ``missing`` samples
        short of S with every prompt admitted to it finished (B = S / mean k, rounded, and
        V0.5's k varies). Each new prompt is counted at ``least``, the fewest samples a
        finished prompt gave, so one round of them fills the batch; ``cap_samples`` trims the
        surplus (their rollouts still feed their baselines). The room left at ``deadline`` is
        that many prompts whatever B is now: B follows the mean k of the prompts that just
        finished, and may have fallen below the admissions the deadline already holds (a
        top-up counted from the old B then left no room, and the batch waited for ever)."""
        n = -(-missing // max(1, least))
        self.extra[deadline] = self.quota[deadline] + n - self.quota_size

    def release(self, deadline: int, refill: bool = False) -> None:
        """A prompt of ``deadline`` dropped: its place is free again (``refill``: a filtered
        prompt, counted against the deadline's refills)."""
        self.quota[deadline] -= 1
        if refill:
            self.refills[deadline] += 1

    def move(self, old: int, new: int) -> None:
        """A prompt re-generated for a later deadline."""
        self.quota[old] -= 1
        self.quota[new] += 1

    def finished(self, trainable: int) -> None:
        self.recent_k.append(trainable)

    def handed(self, version: int, deadlines: list[int]) -> None:
        """The learner took a batch at ``version`` of prompts due at ``deadlines``."""
        self.taken, self.last_batch = version, list(deadlines)

    def new_version(self, version: int) -> None:
        """The learner reported ``version``; the same as the taken batch's: it skipped that
        step (NaN) and its prompts are dropped by the trainer, so their quota returns and
        admission does not starve."""
        if self.taken == version:
            for d in self.last_batch:
                self.quota[d] -= 1
        self.taken, self.last_batch = None, []

    def past(self, version: int, settled: Callable[[int], bool]) -> list[int]:
        """Forget deadlines before ``version``: ``settled`` ones (nothing unfinished due
        there) leave the quota; returns those. Refills are read only for open deadlines."""
        gone = [d for d in self.quota if d < version and settled(d)]
        for d in gone:
            del self.quota[d]
        for d in [d for d in self.refills if d < version]:
            del self.refills[d]
        for d in [d for d in self.extra if d < version]:
            del self.extra[d]
        return gone

    def snapshot(self) -> dict:
        return {"refills": {str(d): n for d, n in self.refills.items()},
                "quota": {str(d): n for d, n in self.quota.items()},
                "extra": {str(d): n for d, n in self.extra.items()}}

    def restore(self, snap: dict, shift: int) -> None:
        """A ``snapshot``, every deadline moved by ``shift`` versions."""
        self.refills.update({int(d) + shift: n for d, n in snap["refills"].items()})
        self.quota.update({int(d) + shift: n for d, n in snap["quota"].items()})
        # Absent from checkpoints written before top-ups.
        self.extra.update({int(d) + shift: n for d, n in snap.get("extra", {}).items()})

    def sizes(self) -> dict[str, int]:
        return {"quota": len(self.quota), "refills": len(self.refills), "extra": len(self.extra)}
