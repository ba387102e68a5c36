"""A revision loaded beside the live one ahead of a switch (``spec.stage.preload``).

The operator asks an owner to preload a revision already staged in its volume
(``POST /v1/preload``). The owner loads it into a backend of its own, in the background
and warmed up when the owner warms up, while the live revision serves on: memory for both
revisions for as long as it is held. A later reload to that revision (rolling or lockstep)
takes it and swaps it in, so the switch costs the swap and the first token, as the commit
of a lockstep reload that loaded beside does, and the owner stays ready throughout.

One preload at a time: asking for another revision drops the one held; ``DELETE
/v1/preload`` drops it; so does a transition that leaves its revision live some other way
(an in-place switch to it, or a reload that began before it was loaded). A backend that
cannot load beside (torch, the vendor adapters) or an owner without the memory for both
revisions says so (state ``failed`` with the reason), and a reload to it loads as always.
The state is in ``GET /v1/identity`` (``preload``), which the operator reads every pass.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from . import api, transitions
from .revisions import Revision

if TYPE_CHECKING:
    from .runtime import Owner

log = logging.getLogger("resident.owner")


class Preloads:
    """The owner's one preload: what was asked, how it stands, and the backend it loaded."""

    def __init__(self, owner: "Owner") -> None:
        self.owner = owner
        self.lock = threading.Lock()
        self.status: api.PreloadStatus | None = None
        self.runtime = None          # the backend holding the loaded revision, when loaded

    def request(self, revision: Revision) -> api.PreloadStatus:
        """Preload ``revision`` (not the live one); already preloading or loaded: as it is."""
        digest = revision.digest
        with self.lock:
            if self.status is not None and self.status.digest == digest and self.status.state != "failed":
                return self.status.model_copy()
            self._drop_locked()
            self.status = api.PreloadStatus(digest=digest, state="loading")
            mine = self.status
        threading.Thread(target=self._load, args=(mine, revision), name="preload", daemon=True).start()
        return mine.model_copy()

    def drop(self) -> api.PreloadStatus | None:
        """Drop what is held or loading; returns what it was."""
        with self.lock:
            was = self.status
            self._drop_locked()
            return was

    def take(self, digest: str):
        """The loaded backend of ``digest``, which the caller now owns (None if there is none:
        another revision, still loading, or failed)."""
        with self.lock:
            if self.status is None or self.status.digest != digest or self.runtime is None:
                return None
            runtime, self.runtime, self.status = self.runtime, None, None
            return runtime

    def settle(self) -> None:
        """After a transition: a preload of the revision now live is of no more use."""
        with self.lock:
            if self.status is not None and self.status.digest == self.owner.live_digest():
                self._drop_locked()

    def current(self) -> api.PreloadStatus | None:
        with self.lock:
            return None if self.status is None else self.status.model_copy()

    def _drop_locked(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
        self.runtime, self.status = None, None   # a load still running finds itself dropped

    def _load(self, mine: api.PreloadStatus, revision: Revision) -> None:
        owner = self.owner
        try:
            refusal = transitions.beside_refusal(owner.backend)
            if refusal:
                raise PreloadRefused(refusal)
            runtime = transitions.load_beside(owner, revision)
        except Exception as e:  # noqa: BLE001 - the live revision serves on, whatever failed
            reason = str(e) if isinstance(e, PreloadRefused) else f"{type(e).__name__}: {e}"
            log.warning("preload failed", extra={"bundle": mine.digest, "reason": reason})
            with self.lock:
                if self.status is mine:
                    mine.state, mine.reason = "failed", reason
            return
        with self.lock:
            if self.status is mine and mine.digest != owner.live_digest():
                self.runtime, mine.state = runtime, "loaded"
                log.info("preloaded beside the live revision", extra={"bundle": mine.digest})
                return
        runtime.close()   # dropped, replaced or made live some other way while it loaded


class PreloadRefused(Exception):
    """This owner cannot preload: its backend cannot, or memory for two revisions is not there."""
