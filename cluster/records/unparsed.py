"""A run whose answers the grader cannot read learns nothing, and says so once.

Every unparsed answer gets the low reward, so a run whose model never writes the answer format
the grader reads (a small model that ignores a ``\\boxed{}`` instruction, a length cap that
cuts every answer off, a grader that expects another format) trains on a constant reward
without a word. ``UnparsedWatch`` is fed each step's trained prompts and, over the run's first
``WINDOW_STEPS`` steps, once it has seen ``MIN_ROLLOUTS`` rollouts of which at least
``THRESHOLD`` were unparsed, returns one line naming the likely causes, with the figures
that point at each: the share cut off at ``rollout.max_tokens``, the format the task's grader
reads, the prompt's format instruction.
"""
from __future__ import annotations

THRESHOLD = 0.9      # unparsed share that is "nearly all"
MIN_ROLLOUTS = 32    # rollouts before judging
WINDOW_STEPS = 5     # judged within the run's first steps only (said once, or never)


class UnparsedWatch:
    def __init__(self, max_tokens: int, answer_format: str):
        self.max_tokens, self.answer_format = max_tokens, answer_format
        self.rollouts = self.unparsed = self.at_cap = self.steps = 0
        self.said = False

    def step(self, records) -> str | None:
        """A step's ``PromptRecord``s; the line to say, once, or None."""
        self.steps += 1
        if self.said or self.steps > WINDOW_STEPS:
            return None
        for r in records:
            self.rollouts += len(r.lengths)
            self.unparsed += r.unparsed
            self.at_cap += sum(n >= self.max_tokens for n in r.lengths)
        if self.rollouts < MIN_ROLLOUTS or self.unparsed < THRESHOLD * self.rollouts:
            return None
        self.said = True
        return self.line()

    def line(self) -> str:
        share, cut = self.unparsed / self.rollouts, self.at_cap / self.rollouts
        causes = [f"{cut:.0%} of the answers stopped at rollout.max_tokens "
                  f"({self.max_tokens}): raise it if they were cut off before their answer"
                  if cut >= 0.5 else
                  f"rollout.max_tokens ({self.max_tokens}) cut off {cut:.0%} of them",
                  f"the grader reads {self.answer_format}: does the prompt's format instruction "
                  "ask for that, and does the model follow it (a small model may not)?",
                  "a reward function or grader that expects another format"]
        return (f"{share:.0%} of the {self.rollouts} answers of the first {self.steps} steps "
                "could not be graded (each got the low reward: the run learns nothing from "
                "them). Likely causes: " + "; ".join(causes) + ".")
