"""The scheduling policy: admission, dispatch, cancellation, staleness and hand-over.

The package: ``messages`` (the config and what the driver carries out), ``state`` (what the
scheduler keeps of a prompt in flight), ``core`` (the ``Scheduler``), ``checkpoint`` (its
snapshot and restore).

One pure object (no Ray, no asyncio, no clock of its own) that three drivers call: the
``Coordinator`` actor with real vLLM generators, the unit tests with fake generators and a
fake clock, and the cluster simulator (``bench.sim``) with simulated engines. The simulator
therefore predicts the scheduler we ship.

The driver feeds events and carries out the actions the scheduler returns::

    sched = Scheduler(SchedulerConfig(...), estimator, n_generators=2)
    n = sched.room()                          # how many new prompts fit now
    acts = sched.admit(problems, priors)      # -> [Dispatch, ...]
    acts = sched.on_rollouts(request_id, [Finished(...), ...])   # rewards arrive
    acts = sched.on_request_failed(request_id, generator_lost=True)
    sched.set_version(v)                      # a learner step published version v (no actions)
    batch = sched.take_batch(B)               # PromptInFlights to train on now, or None: wait

Rules (docs/pipeline.md, "The scheduler"):
- **Capacity in sequence slots.** Each generator holds at most ``slots_per_generator``
  running sequences (vLLM's ``max_num_seqs``); new prompts are admitted only into free slots,
  all k_init rollouts of a prompt on one generator (they share the prompt's prefix).
- **Extra rollouts first.** A prompt's further rollouts (planned in batches by its
  ``PromptState``) go to the generator that holds its prefix when it has a free slot, else
  to the least loaded one; they are never held back for capacity, so a prompt in flight
  always makes progress. Engine priority is earliest deadline first, and extra rollouts go
  before new prompts due at the same version.
- **Cancellation.** When a prompt's plan shrinks, its least advanced outstanding rollouts
  (the most recently dispatched) are cancelled in the engine; their tokens are counted.
- **Staleness by deadline.** Every admitted prompt takes a *deadline*: the policy version at
  which it must be trained, at most ``max_staleness`` versions after its admission. Each
  deadline has a quota of B admissions (a calendar; B is ``batch_prompts``, or with
  ``batch_samples`` S the prompts that S samples make at the recent mean k), taken by the
  earliest deadline in the window with quota left; a prompt trained early does not give its quota
  back (a prompt admitted into it now would have little slack before the learner must wait
  for it), a dropped one does (DAPO's refill). Every sample of a prompt starts at or after its
  admission version, so a sample trained by its deadline is at most ``max_staleness``
  versions old. The hand-over at version V is earliest deadline first: it waits for every
  prompt due at V (at most B by the quota) and fills the batch with the finished prompts of
  the earliest deadlines (streaming: a prompt due later can be trained as soon as it is
  finished). In the steady state a new prompt is due ``max_staleness`` versions after its
  admission. A prompt due now whose later rounds still run is cut there (its outstanding
  rollouts cancelled, its baseline taken from the k >= k_init rewards in hand, counted as
  ``deadline_cuts``): only a prompt's first round is ever waited for. A sample older than the bound anyway (only after a resume or a lost generator)
  is re-generated, and after ``max_regenerations`` the prompt is dropped (both counted).
- **Synchronous mode is the same policy with a barrier**: ``max_staleness = 0`` leaves one
  deadline (the current version), so B prompts are admitted at a version boundary, the
  learner trains when all of them are finished, and nothing is admitted until the next
  version is published. DAPO's filtered prompts free their place and are refilled. With
  ``batch_samples`` S, a barrier's B prompts may hold fewer than S samples (B is S over the
  recent mean k, rounded, and V0.5's k varies by prompt): the version then takes more prompts
  (``AdmissionCalendar.top_up``) until it holds S, the surplus trimmed by ``cap_samples``.
- **Accounting.** Every admitted prompt ends exactly once: handed to the learner, dropped
  with a counted reason, or still in flight (or finished, waiting) at the end.
"""
from actors.scheduler.core import Scheduler
from actors.scheduler.messages import Cancel, Dispatch, Finished, SchedulerConfig, priority
from actors.scheduler.state import PromptInFlight

__all__ = ["Cancel", "Dispatch", "Finished", "PromptInFlight", "Scheduler", "SchedulerConfig",
           "priority"]
