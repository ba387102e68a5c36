"""Backends: one protocol, a registry by name, real cpu and torch backends, vendor adapters.

The registry maps a name to ``module:Class`` and imports it only when asked, so a cpu
owner never imports a vendor SDK or torch and a missing SDK surfaces as a clear
:class:`~owner.backends.base.BackendUnavailable` at start, not as an ImportError.
"""

from __future__ import annotations

import importlib

from .base import Backend, BackendError, BackendUnavailable

REGISTRY: dict[str, str] = {
    "cpu": "owner.backends.cpu:CpuBackend",
    "rngd": "owner.backends.rngd:RngdBackend",
    "atom": "owner.backends.atom:AtomBackend",
    "torch": "owner.backends.torch_lm:TorchBackend",
}


def backend_class(name: str) -> type:
    """The backend class registered under ``name``."""
    if name not in REGISTRY:
        raise BackendError(f"unknown backend {name!r}; known: {', '.join(sorted(REGISTRY))}")
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def create_backend(name: str, **options) -> Backend:
    return backend_class(name)(**options)


__all__ = ["REGISTRY", "Backend", "BackendError", "BackendUnavailable", "backend_class", "create_backend"]
