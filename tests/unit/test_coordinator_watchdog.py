"""What the coordinator tells the watchdog it is waiting on (pure state, no Ray calls)."""
import time

from actors.coordinator import Coordinator, CoordinatorConfig
from actors.scheduler import SchedulerConfig
from estimator import make_estimator
from tasks import TaskConfig


def coordinator(n_gens=2):
    return Coordinator([object()] * n_gens, None, make_estimator("grpo"), CoordinatorConfig(
        TaskConfig(), SchedulerConfig(batch_prompts=2, max_staleness=1, slots_per_generator=64)))


def test_names_the_generator_that_holds_work_and_stopped_answering():
    c = coordinator()
    c.sched.admit(["a"], [None])              # 4 rollouts dispatched to one generator
    busy = next(i for i, n in enumerate(c.sched.load) if n)
    c.pool.last_heard[busy] = time.time() - 120
    w = c.waiting_on()
    assert w.role.startswith(f"generator {busy} (4 rollouts outstanding")
    assert w.outstanding_per_generator == {busy: 4}


def test_every_generator_lost_and_a_pending_prior():
    c = coordinator()
    c.sched.mark_lost(0)
    c.sched.mark_lost(1)
    assert c.waiting_on().role.startswith("generators (every one lost")
    c.prior_pending_since = time.time() - 5
    assert c.waiting_on().role.startswith("prior (asked")


def test_nothing_in_flight_and_no_room():
    c = coordinator()
    c.sched.paused = True
    w = c.waiting_on()
    assert w.role == "coordinator (nothing in flight, no room to admit)" and w.paused
