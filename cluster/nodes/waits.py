"""Readings of bounded waits over several actors' calls: pure functions of what ``ray.wait``
and ``ray.get`` gave (unit-tested without Ray)."""
from __future__ import annotations


def outcomes(refs: list, ready: list, get) -> list[tuple[object, object]]:
    """(result, None) for each ref of ``refs`` in ``ready`` whose ``get`` succeeded, else
    (None, why): "timeout" for one not ready when the wait ended, the exception for one that
    raised. The one reading of a bounded ``ray.wait`` over several actors' calls."""
    done, out = set(ready), []
    for ref in refs:
        if ref not in done:
            out.append((None, "timeout"))
            continue
        try:
            out.append((get(ref), None))
        except Exception as err:  # noqa: BLE001 - the caller decides which are its
            out.append((None, err))
    return out


def gather_stats(refs: list, wait, get, timeout_s: float, dead: tuple = ()) -> list:
    """The answers to ``refs`` (one stats call per generator), waited for together for at
    most ``timeout_s``; None for one that has not answered by then (hung, or busy in a long
    call) or whose actor died (``dead`` errors; any other error is raised). Per-step
    telemetry never holds the step loop up for long (it used to wait for each generator in
    turn, up to 60 s each, twice a step). ``wait``/``get``: ``ray.wait``/``ray.get``."""
    if not refs:
        return []
    ready, _ = wait(refs, num_returns=len(refs), timeout=timeout_s)
    out = []
    for value, why in outcomes(refs, ready, get):
        if isinstance(why, Exception) and not isinstance(why, dead):
            raise why
        out.append(value)
    return out


def failed_updates(refs: list, ready: list, get) -> dict[int, str]:
    """The generators (by index in ``refs``, one update ref each) that did not load a
    publish's weights, and why: a ref not in ``ready`` when the wait ended ("timeout": hung,
    or never got them), or one whose result raised (the error's type: ``RayActorError`` for a
    dead one, ``RayTaskError`` when its ``update_weights`` raised). ``get`` fetches a ready
    ref's result."""
    return {i: why if why == "timeout" else type(why).__name__
            for i, (_, why) in enumerate(outcomes(refs, ready, get)) if why is not None}
