"""Common shape of the NPU adapters: a vendor SDK imported lazily, reload-only.

A vendor backend loads a revision's compiled artifact with the vendor's own runtime.
Those runtimes expose no row-level write into live device memory that we could journal
and read back, so the adapters report ``in_place=False`` and every transition to them is
a reload (close, then load). The SDK reads the revision directory itself, so before it
is opened every file there is hashed against the manifest and a file the manifest does
not name is refused (:func:`owner.revisions.verify_tree`): nothing unverified reaches the
SDK. The SDK is imported when the backend is constructed: on a machine without it the
owner fails at start with :class:`BackendUnavailable` naming the package to install.
These adapters have not been run on RNGD or ATOM hardware; they
are written against the vendors' public Python APIs and are not claimed to work until
they are.
"""

from __future__ import annotations

import importlib
import time

from ..inplace import ApplyReport, StagedUpdate
from ..revisions import Revision, verify_tree
from .base import BackendError, BackendUnavailable, Description, LoadReport, Output


class VendorBackend:
    name = "vendor"
    sdk_module = ""  # imported lazily
    sdk_hint = ""  # what to install

    def __init__(self) -> None:
        try:
            self.sdk = importlib.import_module(self.sdk_module)
        except ImportError as e:
            raise BackendUnavailable(
                f"the {self.name} backend needs the Python module {self.sdk_module!r} ({self.sdk_hint}); "
                f"it is not importable here: {e}") from None
        self.revision: Revision | None = None
        self.engine = None

    # subclasses: open the runtime for a revision dir, and run one prompt
    def _open(self, revision: Revision):
        raise NotImplementedError

    def _run(self, prompt: str, max_tokens: int) -> tuple[list[int], str]:
        raise NotImplementedError

    def load(self, revision: Revision) -> LoadReport:
        if self.revision is not None:
            raise BackendError("a revision is already loaded; use reload")
        t0 = time.perf_counter()
        verify_tree(revision)
        self.engine = self._open(revision)
        self.revision = revision
        return LoadReport(time.perf_counter() - t0, 0.0, False)

    def reload(self, revision: Revision) -> LoadReport:
        self.close()
        return self.load(revision)

    def close(self) -> None:
        engine, self.engine, self.revision = self.engine, None, None
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def describe(self) -> Description:
        ident = self.revision.manifest.identity() if self.revision else None
        return Description(self.name, False, ident, tuple(self.variants()))

    def variants(self) -> list[str]:
        return ["default"] if self.engine is not None else []

    def generate(self, prompt: str, max_tokens: int, variant: str | None = None) -> Output:
        if self.engine is None:
            raise BackendError("no model is loaded")
        t0 = time.perf_counter()
        tokens, text = self._run(prompt, max_tokens)
        # the vendor APIs used here return whole completions, so this is time to last token
        return Output(tokens, text, time.perf_counter() - t0)

    def stage_in_place(self, revision: Revision) -> StagedUpdate:
        raise BackendError(f"the {self.name} backend cannot update in place")

    def apply_in_place(self, update: StagedUpdate) -> ApplyReport:
        raise BackendError(f"the {self.name} backend cannot update in place")
