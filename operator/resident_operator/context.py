"""Everything one reconcile pass of one model works with, in one place.

The handlers build a :class:`ModelContext` per pass: the API client, the settings, which
model (namespace, name, UID), a clock and a way to post Kubernetes Events. The pass
functions (``owners.py``, ``rollout.py``, ``cleanup.py``) take it instead of reaching for
globals, which also lets unit tests run them against simple stand-ins for the clock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from .kube import Kube
from .naming import LABEL_MODEL, fit
from .settings import OperatorSettings

log = logging.getLogger("resident_operator")
EventFn = Callable[[str, str, bool], None]  # (reason, message, warning)


@dataclass
class ModelContext:
    kube: Kube
    settings: OperatorSettings
    namespace: str
    name: str
    uid: str
    body: dict[str, Any]
    post_event: EventFn = lambda reason, message, warning: None
    clock: Callable[[], float] = time.time
    token: str = ""

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event on the model (for humans) plus a structured log line."""
        log.log(logging.WARNING if warning else logging.INFO, message,
                extra={"model": f"{self.namespace}/{self.name}", "reason": reason})
        self.post_event(reason, message, warning)

    @property
    def selector(self) -> str:
        return f"{LABEL_MODEL}={fit(self.name)}"
