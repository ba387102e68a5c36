"""The backend protocol every owner runtime speaks: load, describe, generate,
apply_in_place, reload, close; and optionally ``generate_stream``.

A backend holds one model revision on one card. It never takes locks itself: the owner
runtime serializes inference and transitions around it. ``apply_in_place`` receives an
already staged and admitted update (see :mod:`owner.inplace`); a backend that cannot
update in place says so in ``describe()`` and is never asked. ``reload`` may raise
:class:`ReloadRefused` when it failed before touching the live revision (which then still
serves); after any other error the backend is closed.

Streaming is optional: a backend that yields tokens as it produces them offers
``generate_stream(prompt, max_tokens)``, an iterator of :class:`Piece`; :func:`stream` uses
it when present and otherwise turns one ``generate`` into a single piece, so any backend
can answer a streaming request (its client then sees the whole text at once).

So is ``first_token(variant)``: one token from the live model without a user's prompt, for
warm-up and the check after a transition. A backend whose tokenizer may encode a short
text to nothing (a checkpoint's own tokenizer, or the cpu demo's words) starts it from a
token id; :func:`first_token` otherwise generates one token from :data:`PROBE_PROMPT`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, runtime_checkable

from .. import inplace
from ..inplace import ApplyReport, ReleaseFailed, StagedUpdate
from ..revisions import Revision


class BackendError(RuntimeError):
    """The backend cannot do what was asked (bad model, not loaded, ...)."""


class BackendUnavailable(BackendError):
    """The backend's SDK or device is not present on this machine."""


class ReloadRefused(BackendError):
    """A reload failed before it touched the live revision, which is still loaded and serves."""


@dataclass(frozen=True)
class Residency:
    """Where the live weights sit: device (``cpu``, ``cuda:0``), dtype, bytes held there."""

    device: str
    dtype: str
    bytes: int


@dataclass(frozen=True)
class Description:
    backend: str
    in_place: bool
    identity: dict[str, str] | None
    variants: tuple[str, ...]
    residency: Residency | None = None  # None while nothing is loaded


@dataclass(frozen=True)
class Output:
    tokens: list[int]
    text: str
    first_token_seconds: float
    logits: list | None = None  # per generated token, for parity checks
    prompt_tokens: int | None = None  # how many tokens the prompt was, when the backend says


@dataclass(frozen=True)
class Piece:
    """Tokens generated since the last piece and the text they complete (a multi-byte
    character split over tokens arrives with its last token)."""
    tokens: list[int]
    text: str
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class LoadReport:
    read_seconds: float
    compile_seconds: float
    graph_reused: bool  # the compiled graph was kept (same graph digest)
    weights_reused: bool = False  # the live weights were kept and no weights file was read


@runtime_checkable
class Backend(Protocol):
    name: str

    def load(self, revision: Revision) -> LoadReport: ...
    def describe(self) -> Description: ...
    def variants(self) -> list[str]: ...
    def generate(self, prompt: str, max_tokens: int, variant: str | None = None) -> Output: ...
    def stage_in_place(self, revision: Revision) -> StagedUpdate: ...
    def apply_in_place(self, update: StagedUpdate) -> ApplyReport: ...
    def reload(self, revision: Revision) -> LoadReport: ...
    def close(self) -> None: ...


def stream(backend: Backend, prompt: str, max_tokens: int) -> Iterator[Piece]:
    """The generation as pieces: the backend's own ``generate_stream`` when it has one, else
    one piece holding the whole output of ``generate``."""
    own = getattr(backend, "generate_stream", None)
    if own is not None:
        yield from own(prompt, max_tokens)
        return
    out = backend.generate(prompt, max_tokens)
    yield Piece(list(out.tokens), out.text, out.prompt_tokens)


PROBE_PROMPT = "\n"


def first_token(backend: Backend, variant: str | None = None) -> Output:
    """One token from the live model (see the module docstring): the backend's own
    ``first_token`` when it has one, else ``generate`` on :data:`PROBE_PROMPT`."""
    own = getattr(backend, "first_token", None)
    if own is not None:
        return own(variant)
    return backend.generate(PROBE_PROMPT, 1, variant)


def apply_and_advance(backend, store: inplace.RowStore, update: StagedUpdate, verify_chunks: bool) -> ApplyReport:
    """Apply an admitted update to ``store`` (see :func:`owner.inplace.apply`) and move
    ``backend.revision`` to the target whenever the new rows are live, also when only the
    release of staged memory failed after them."""
    try:
        report = inplace.apply(store, update, verify_chunks)
    except ReleaseFailed as e:
        if e.applied:
            backend.revision = update.target
        raise
    backend.revision = update.target
    return report
