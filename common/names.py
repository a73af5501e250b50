"""Ray actor names: each role is named by its run and its role, ``<run>/<role>``
(``v05-cpu/generator-0``, ``v05-cpu/learner-rank-0``, ``v05-cpu/prior``,
``v05-cpu/coordinator``, ``v05-cpu/telemetry``), so that the Ray dashboard's Actors page
tells two runs on one cluster apart.

Ray keeps a name unique within a namespace. Each job (a driver: ``cluster.launch``, a bench,
pytest) that does not ask for a namespace gets an anonymous one of its own, so two jobs with
the same ``run.name`` never collide. Within one job a name can still be held: a run resumed
or repeated under the same name on roles that outlive a run (tests, ``bench.harness``), while
the earlier run's actor is still going away (``ray.kill`` returns before the name is free).
Such a role gets the first free ``<run>/<role>~2``, ``~3``, ...

Roles that outlive one run (generators, prior, learner ranks) carry the name of the run that
started them: in a bench, every run on the shared roles sees them under the bench's base
config name, while each run's coordinator and telemetry carry that run's own name.

Standard library only; ray is imported when a name is looked up.
"""
from __future__ import annotations

from typing import Callable

SUFFIX = "~"  # between a held name and its count: <run>/<role>~2


def role_name(run: str, role: str) -> str:
    """``<run>/<role>``: the name a role's actor gets when nothing else holds it."""
    return f"{run}/{role}"


def first_free(name: str, taken: Callable[[str], bool]) -> str:
    """``name`` if not ``taken``, else the first of ``name~2``, ``name~3``, ... that is not."""
    candidate, n = name, 1
    while taken(candidate):
        n += 1
        candidate = f"{name}{SUFFIX}{n}"
    return candidate


def held_in_namespace(name: str) -> bool:
    """Whether an actor of this job's Ray namespace holds ``name`` now (alive, starting or
    restarting; a dead actor's name is free)."""
    import ray

    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def actor_name(run: str, role: str) -> str:
    """The name for a new actor of ``role`` in ``run``: ``<run>/<role>``, or its first free
    ``~N`` when an actor of this namespace still holds it."""
    return first_free(role_name(run, role), held_in_namespace)
