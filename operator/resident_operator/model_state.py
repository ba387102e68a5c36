"""The operator's durable memory of one model, kept in its ``status``.

Everything a restarted operator needs to continue lives in the ResidentModel's status,
never in process memory: the recorded children (``children``), the committed revision the
owners run (``bundle``), the incarnation counter of each owner slot (``incarnations``), the
transition in flight (``transition``), the one queued behind it (``pendingTransition``) and
the last finished one (``lastTransition``). :class:`ModelState` reads them once per pass
and writes each change to the API server immediately, so "record before depend" holds:
a child's UID is stored before the next step relies on it. Inside :meth:`ModelState.together`
the changes of one step (a child created and the progress that names it) go out as one
status write when the step ends; a crash between the create and that write leaves a child
labelled with the model's UID that the next pass adopts (``owners.create_child``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from . import children as ch
from .transition import TransitionState

Patch = Callable[[dict[str, Any]], None]


class ModelState:
    def __init__(self, status: dict[str, Any] | None, patch: Patch) -> None:
        status = status or {}
        self._write = patch
        self._held: dict[str, Any] | None = None
        self.children: list[ch.Child] = [dict(c) for c in status.get("children") or []]
        self.bundle: dict[str, str] = dict(status.get("bundle") or {})
        self.incarnations: dict[str, int] = {k: int(v) for k, v in (status.get("incarnations") or {}).items()}
        raw = status.get("transition")
        self.transition: TransitionState | None = TransitionState.model_validate(raw) if raw else None
        self.pending: dict[str, Any] | None = status.get("pendingTransition") or None
        self.last_transition: dict[str, Any] | None = status.get("lastTransition") or None

    def _patch(self, patch: dict[str, Any]) -> None:
        if self._held is None:
            self._write(patch)
        else:
            self._held.update(patch)

    @contextmanager
    def together(self) -> Iterator[None]:
        """Write the changes made inside as one status patch at the end (also on an error)."""
        if self._held is not None:
            yield
            return
        self._held = {}
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                self._write(held)

    # -- children ------------------------------------------------------------------
    def record_child(self, obj: dict[str, Any]) -> None:
        self.children = ch.record(self.children, ch.child_ref(obj))
        self._patch({"children": self.children})

    def forget_child(self, uid: str) -> None:
        before = len(self.children)
        self.children = ch.forget(self.children, uid)
        if len(self.children) != before:
            self._patch({"children": self.children})

    # -- revision, slots -----------------------------------------------------------
    def commit_bundle(self, digest: str, source: str) -> None:
        self.bundle = {"digest": digest, "source": source}
        self._patch({"bundle": self.bundle})

    def incarnation(self, slot: int) -> int:
        return self.incarnations.get(str(slot), 0)

    def bump_incarnation(self, slot: int) -> int:
        self.incarnations[str(slot)] = self.incarnation(slot) + 1
        self._patch({"incarnations": dict(self.incarnations)})
        return self.incarnations[str(slot)]

    # -- transitions ---------------------------------------------------------------
    def save_transition(self) -> None:
        self._patch({"transition": self.transition.dump() if self.transition else None})

    def finish_transition(self, summary: dict[str, Any]) -> None:
        self.transition = None
        self.last_transition = summary
        self._patch({"transition": None, "lastTransition": summary})

    def set_pending(self, pending: dict[str, Any] | None) -> None:
        if pending != self.pending:
            self.pending = pending
            self._patch({"pendingTransition": pending})
