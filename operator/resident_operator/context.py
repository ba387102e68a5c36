"""Everything one reconcile pass of one model works with, in one place.

The driver builds a :class:`ModelContext` per pass: the API client, the settings, which
model (namespace, name, UID), a clock and a way to post Kubernetes Events. The pass
functions (``owners.py``, ``rollout.py``, ``cleanup.py``) take it instead of reaching for
globals, which also lets unit tests run them against simple stand-ins for the clock.

A pass also says what should happen after it, in :class:`FollowUp`: run again at once
(it made progress that the next step can build on), look again after some seconds (a
timeout or a retry is due), wait on an owner's transition, or wait on the probe of a
source that is down (``source_probes.py``). Everything else that
moves a model forward arrives as a watch event (see ``driver.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .kube import Kube
from .naming import LABEL_MODEL, fit
from .settings import OperatorSettings
from .source_probes import SourceProbes

if TYPE_CHECKING:
    from .owner_client import OwnerCalls

log = logging.getLogger("resident.operator")
EventFn = Callable[[str, str, bool], None]  # (reason, message, warning)


@dataclass(frozen=True)
class OwnerWait:
    """An owner transition to wait on (``GET url?waitSeconds=N`` with the bearer token)."""

    url: str
    token: str


@dataclass
class FollowUp:
    """What the driver should do after a pass: again at once, after ``due`` s, on an owner,
    or on sources that are down (``source_waits``: (source URI, error) pairs)."""

    again: bool = False
    due: float | None = None
    owner_waits: list[OwnerWait] = field(default_factory=list)
    source_waits: list[tuple[str, str]] = field(default_factory=list)

    def recheck_in(self, seconds: float) -> None:
        self.due = max(0.0, seconds if self.due is None else min(self.due, seconds))


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
    endpoint: str | None = None   # status.endpoint once the companions were checked; None: check
    follow_up: FollowUp = field(default_factory=FollowUp)
    sources: SourceProbes | None = None   # the operator's open source probes; None: none shared
    owner_calls: "OwnerCalls | None" = None   # the operator's gate for owner calls (owner_client.py)

    created: list[tuple[str, str]] = field(default_factory=list)   # (reason, what) since the last Event

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event on the model (for humans) plus a structured log line."""
        log.log(logging.WARNING if warning else logging.INFO, message,
                extra={"model": f"{self.namespace}/{self.name}", "reason": reason})
        self.post_event(reason, message, warning)

    def child_created(self, reason: str, what: str) -> None:
        """A child this pass created: logged now, told in the pass's one Event of what it
        created (:meth:`announce_created`)."""
        log.info(f"created {what}", extra={"model": f"{self.namespace}/{self.name}", "reason": reason})
        self.created.append((reason, what))

    def announce_created(self) -> None:
        """One Event for every child created since the last: a model's first pass creates
        five (its owner Pods, token Secret, Service, budget and policy), and one Event each
        would be five writes. The reason is the one child's own (``OwnerPodCreated``,
        ``ServiceCreated``...), ``OwnerPodCreated`` whenever an owner Pod is among them,
        else ``ChildrenCreated``."""
        if not self.created:
            return
        reasons = [reason for reason, _ in self.created]
        reason = (reasons[0] if len(set(reasons)) == 1 else
                  "OwnerPodCreated" if "OwnerPodCreated" in reasons else "ChildrenCreated")
        message = "created " + ", ".join(what for _, what in self.created)
        self.created = []
        self.post_event(reason, message, False)

    @property
    def selector(self) -> str:
        return f"{LABEL_MODEL}={fit(self.name)}"

    def children(self, kind: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The model's owner Pods or BundleDeliveries (``kind``), from the watch cache when
        it can say (``child_cache.py``); ``records`` are the children its status records."""
        recorded = [r["uid"] for r in records if r.get("kind") == kind]
        return self.kube.children(self.namespace, kind, fit(self.name), recorded)
