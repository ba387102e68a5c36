"""One probe per source: models whose source is down wait on one health probe of it.

**The same source** is the server a network source's bytes come from: its transport
scheme, host and port (:func:`source_key`). ``http://h/a`` and ``http://h:80/b`` are one
source, and so are ``oci+http://h:5000/repo`` and ``http://h:5000/layout`` (one server,
spoken to the same way); ``https://h`` and ``http://h`` are two. ``oci://`` is https, its
``oci+http://`` form http; default ports are 80 and 443; hosts compare case-insensitively.
An ``s3://`` source's server is its ``endpoint=`` (whatever the bucket, prefix or
addressing: a virtual-host request goes to the same server), or AWS's
``https://s3.<region>.amazonaws.com`` without one.
A ``file://`` source has no server and no key: a directory that is missing is the model's
own problem, and such a model keeps retrying on its own backoff
(:func:`~.source_check.retry_after`).

**Down** means a manifest read failed because the server did not answer usefully: no
connection, a timeout, or 5xx/429 after the source's own retries
(:func:`bundle.sources.is_outage`). A 404 is an answer: the server is up and does not
hold that digest, which is the model's own problem too.

**The probe** (``driver.probe_source``) is ``GET <scheme>://<host>:<port>/``; any HTTP
answer below 500 other than 429 means the source answers. It carries no credentials, for
an s3 endpoint too (which answers an anonymous ``GET /`` with 403): it asks only whether
the server answers, which is the same for every model on it, whatever Secret each names.
Each model's credentials are put to the test by its own manifest read
(``source_check.py``), which runs again when the probe answers: a refusal there is the
model's ``AccessDenied``, not an outage. The first model whose read
finds the source down opens the probe; every model whose pass needs that source while
the probe is open does not read the source at all: it reports ``SourceUnavailable`` and
joins the probe's waiters. Probes are made 2 s, 4 s, 8 s... after the failure, at most
60 s apart, whatever the number of waiters (``retry_policy.source_backoff``). When a
probe answers, the probe closes and every waiter is woken; each reads its manifest again.
A source that fails again within ``retry_policy.RELAPSE_SECONDS`` of answering resumes the
backoff where it was instead of at 2 s, so a server that answers probes but fails reads
does not make every model read it every 2 s. A waiter that is deleted leaves; a probe with no waiter left stops.

This module is the registry alone, pure and thread-safe: passes (threads) ask whether a
source is down, the driver (the event loop) opens probes, records their results and wakes
the waiters. It makes no request itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Hashable
from urllib.parse import urlsplit

from bundle.manifest import ManifestError
from bundle.sources.hf import HfLocation
from bundle.sources.s3 import S3Location

from . import retry_policy

TRANSPORTS = {"http": "http", "https": "https", "oci": "https", "oci+https": "https", "oci+http": "http"}
DEFAULT_PORTS = {"http": 80, "https": 443}


def source_key(uri: str) -> str | None:
    """``scheme://host:port`` of the server behind a network source; None for file:// (or
    anything that names no server)."""
    if isinstance(uri, str) and uri.startswith("s3://"):
        try:
            loc = S3Location.parse(uri)
        except ManifestError:
            return None
        uri = loc.endpoint or f"https://s3.{loc.region}.amazonaws.com"
    elif isinstance(uri, str) and uri.startswith("hf://"):
        try:
            uri = HfLocation.parse(uri).endpoint   # every repository on a Hub shares its probe
        except ManifestError:
            return None
    try:
        parts = urlsplit(uri)
        transport = TRANSPORTS.get(parts.scheme.lower())
        host, port = parts.hostname, parts.port
    except (AttributeError, ValueError):
        return None
    if transport is None or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{transport}://{host}:{port or DEFAULT_PORTS[transport]}"


def probe_url(key: str) -> str:
    """What the probe of a source GETs: the server's root."""
    return key + "/"


@dataclass
class Probe:
    """One source found down, the models waiting on it and when to probe it next."""

    key: str
    error: str                      # the last failure: the first read's, then the probe's
    due: float                      # clock time of the next probe
    failures: int = 0               # probes that found it down (and reads, after a relapse)
    waiters: set[Hashable] = field(default_factory=set)
    task: Any = None                # the driver's task that probes it (opaque here)

    @property
    def url(self) -> str:
        return probe_url(self.key)


class SourceProbes:
    """The open probes by source key (operator-wide, one instance)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Probe] = {}
        self._answered: dict[str, tuple[float, int]] = {}   # key -> (when, failures then)

    def down(self, source: str) -> str | None:
        """The last error of ``source``'s open probe, or None if no probe is open (it is
        not known to be down, or it has no server)."""
        key = source_key(source)
        with self._lock:
            probe = self._open.get(key) if key else None
            return probe.error if probe else None

    def wait(self, source: str, waiter: Hashable, error: str, now: float) -> Probe | None:
        """``waiter`` waits until ``source`` answers. Returns the probe if this opened it
        (the caller starts probing it), None if it was open already or ``source`` has no
        server."""
        key = source_key(source)
        if key is None:
            return None
        with self._lock:
            probe = self._open.get(key)
            if probe is not None:
                probe.waiters.add(waiter)
                return None
            when, failures = self._answered.pop(key, (None, 0))
            relapse = when is not None and now - when < retry_policy.RELAPSE_SECONDS
            failures = failures + 1 if relapse else 0
            probe = Probe(key, error, now + retry_policy.source_backoff(failures), failures, {waiter})
            self._open[key] = probe
            return probe

    def next_probe(self, key: str) -> float | None:
        """When ``key`` is to be probed next; None once its probe has closed."""
        with self._lock:
            probe = self._open.get(key)
            return probe.due if probe else None

    def failed(self, key: str, error: str, now: float) -> None:
        """A probe found the source down again: back off."""
        with self._lock:
            probe = self._open.get(key)
            if probe is not None:
                probe.failures += 1
                probe.error, probe.due = error, now + retry_policy.source_backoff(probe.failures)

    def answered(self, key: str, now: float) -> set[Hashable]:
        """A probe found the source answering: close it; return every waiter, to wake."""
        with self._lock:
            probe = self._open.pop(key, None)
            if probe is None:
                return set()
            self._answered[key] = (now, probe.failures)
            return set(probe.waiters)

    def leave(self, waiter: Hashable) -> list[Probe]:
        """``waiter`` (a deleted model) waits no more; return the probes left without
        waiters, which are closed (the caller stops their tasks)."""
        with self._lock:
            empty = []
            for key, probe in list(self._open.items()):
                probe.waiters.discard(waiter)
                if not probe.waiters:
                    empty.append(self._open.pop(key))
            return empty

    def open_probes(self) -> list[Probe]:
        with self._lock:
            return list(self._open.values())
