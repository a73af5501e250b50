"""Prior backends behind one interface, built by name: ``make_prior(name, **options)``.

Backends are imported lazily so that building the cheap ones (and ``--help``) never pulls in
torch: the registry maps a config name to "module:Class".
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from actors.priors.base import ConstantPrior, Context, PriorBackend, PriorTraits

_REGISTRY: dict[str, str | Callable[..., PriorBackend]] = {
    "embedded": "actors.priors.embedded:EmbeddedPrior",
    "v0": "actors.priors.v0:V0Prior",
    "constant": ConstantPrior,
}
DEFAULT_BACKEND = "embedded"


def prior_names() -> list[str]:
    return sorted(_REGISTRY)


def register_prior(name: str, factory: Callable[..., PriorBackend] | str) -> None:
    """Add a backend (a class / factory, or "module:Class"); the name must be new."""
    if not name or name in _REGISTRY:
        raise ValueError(f"prior backend name {name!r} is empty or already registered")
    _REGISTRY[name] = factory


def backend_class(name: str) -> type:
    """The class (or factory) registered as ``name``, its module imported (none of them
    imports torch at import time); ValueError for an unknown name."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown prior backend {name!r}; valid: {', '.join(prior_names())}")
    factory = _REGISTRY[name]
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory


def backend_traits(name: str) -> PriorTraits:
    """The traits backend ``name`` declares (its ``traits``; a factory that declares none gets
    the defaults: it scores prompts and may fail)."""
    traits = getattr(backend_class(name), "traits", None)
    return traits if isinstance(traits, PriorTraits) else PriorTraits()


def takes_threads(name: str) -> bool:
    """Whether backend ``name``'s constructor has a ``threads`` option (the server then passes
    it its CPU threads unless the options name some): read from the signature, so that the
    option and the fact cannot disagree."""
    return "threads" in inspect.signature(backend_class(name)).parameters


def make_prior(name: str, **options) -> PriorBackend:
    """Build the backend registered as ``name``; unknown names or options raise ValueError."""
    factory = backend_class(name)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as e:
        raise ValueError(f"bad options for prior backend {name!r}: {e}") from e
    return factory(**options)


__all__ = ["Context", "PriorBackend", "PriorTraits", "ConstantPrior", "DEFAULT_BACKEND",
           "backend_class", "backend_traits", "make_prior", "prior_names", "register_prior",
           "takes_threads"]
