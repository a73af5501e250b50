"""The scheduler's admission calendar: how many new prompts fit now (``room``), in free engine
slots and in the deadlines' quotas (package docstring: "Staleness by deadline"); a mixin of
``Scheduler``, whose state it reads."""
from __future__ import annotations

RECENT_K = 64  # finished prompts whose mean k sizes the quota under ``batch_samples``


class AdmissionCalendar:
    @property
    def quota_size(self) -> int:
        """B: prompts per deadline. With ``batch_samples`` S, S over the mean trainable
        samples (k, but for the oracle) of the newest finished prompts (``batch_prompts``
        before any has finished)."""
        S = self.cfg.batch_samples
        if S is None or not self._recent_k:
            return self.cfg.batch_prompts
        return max(1, round(S / (sum(self._recent_k) / len(self._recent_k))))

    def _open_deadlines(self) -> list[int]:
        """Deadlines that take new prompts: the window [V, V + max_staleness], less deadline V
        once the learner took its batch there (until it reports back), less any deadline
        whose filtered-and-refilled prompts ran over ``max_refill_factor`` x B (a policy that
        solves or fails everything would refill forever; the batch then trains short)."""
        cap = self.cfg.max_refill_factor * self.quota_size
        first = self.version + (self._taken == self.version)
        return [d for d in range(first, self.version + self.cfg.max_staleness + 1)
                if self.refills[d] < cap]

    def _free_deadline(self) -> int | None:
        """The earliest open deadline with quota left (None: none)."""
        for d in self._open_deadlines():
            if self.quota[d] < self.quota_size:
                return d
        return None

    def _quota_room(self) -> int:
        B = self.quota_size
        return sum(max(0, B - self.quota[d]) for d in self._open_deadlines())

    def _slot_room(self) -> int:
        """Prompts whose k_init rollouts fit in free slots (all on one generator each)."""
        s = self.cfg.slots_per_generator
        need = min(self.k_init, s)  # k_init above an engine's slots: one per empty engine
        return sum(max(0, s - load) // need for load, a in zip(self.load, self.alive) if a)

    def room(self) -> int:
        """How many new prompts may be admitted now."""
        if self.paused or self.parked or not any(self.alive):
            return 0
        n = min(self._slot_room(), self._quota_room())
        if self.cfg.max_inflight_prompts is not None:
            n = min(n, self.cfg.max_inflight_prompts - len(self.inflight))
        return max(0, n)

