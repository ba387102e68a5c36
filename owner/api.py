"""Wire models of the owner control API (see docs/contracts.md, "Owner control API").

Requests are strict (unknown fields and malformed digests are rejected with a clear
message); responses use the camelCase names of the contract.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

State = Literal["loading", "ready", "transitioning", "quarantined", "unloaded"]
# "prepared": a two-step transition (commit Deferred) staged everything it can and waits for
# its commit, the live revision serving; "aborted": it was told not to commit (nothing changed)
Result = Literal["running", "prepared", "succeeded", "failed", "needs-reload", "aborted"]
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
MAX_TOKENS = 1024  # the most tokens one request may ask for (both ports)


class Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class Identity(Wire):
    bundle: str
    graph: str
    weights: str


class Capabilities(Wire):
    in_place: bool = Field(alias="inPlace")


class Residency(Wire):
    device: str
    dtype: str
    bytes_resident: int = Field(alias="bytesResident")


class PreloadRequest(Wire):
    target: str = Field(pattern=DIGEST_PATTERN)


class PreloadStatus(Wire):
    """A revision loaded (or loading) beside the live one ahead of a switch (owner/preload.py)."""
    digest: str
    state: Literal["loading", "loaded", "failed"]
    reason: str = ""


class IdentityResponse(Wire):
    state: State
    identity: Identity | None
    backend: str
    capabilities: Capabilities
    residency: Residency | None = None  # where the live weights sit; null while nothing is loaded
    preload: PreloadStatus | None = None  # null: none asked for


class TransitionRequest(Wire):
    target: str = Field(pattern=DIGEST_PATTERN)
    path: Literal["GraphOnly", "WholeBundle"]
    strategy: Literal["Auto", "InPlace", "Reload"] = "Auto"
    # a reload first turns not-ready and keeps serving this long, so the Endpoints drop it
    drain_seconds: float = Field(default=0.0, ge=0, le=120, alias="drainSeconds")
    # false keeps a reloading owner ready (in its Service's endpoints): the only replica, whose
    # clients then get 503 with Retry-After from it, not a connection refused by the Service
    leave_endpoints: bool = Field(default=True, alias="leaveEndpoints")
    # Deferred: prepare (stage, verify, compute what to write), then wait for
    # POST /v1/transitions/{id}/commit (or /abort); after holdSeconds without either, abort
    commit: Literal["Immediate", "Deferred"] = "Immediate"
    hold_seconds: float = Field(default=600.0, gt=0, le=86400, alias="holdSeconds")


class Timings(Wire):
    stage_seconds: float | None = Field(default=None, alias="stageSeconds")
    apply_seconds: float | None = Field(default=None, alias="applySeconds")
    verify_seconds: float | None = Field(default=None, alias="verifySeconds")
    first_token_seconds: float | None = Field(default=None, alias="firstTokenSeconds")
    warmup_seconds: float | None = Field(default=None, alias="warmupSeconds")  # cold reloads only
    total_seconds: float | None = Field(default=None, alias="totalSeconds")


class TransitionStatus(Wire):
    id: str
    from_: str | None = Field(alias="from")
    to: str
    requested: Literal["Auto", "InPlace", "Reload"]
    path: Literal["GraphOnly", "WholeBundle"]
    strategy: Literal["InPlace", "Reload"] | None = None
    result: Result = "running"
    reason: str = ""
    identity: Identity | None = None
    graph_reused: bool | None = Field(default=None, alias="graphReused")
    # a reload kept the live weights (the target's weights digest is the live one): no weights file read
    weights_reused: bool | None = Field(default=None, alias="weightsReused")
    rows_changed: int | None = Field(default=None, alias="rowsChanged")
    bytes_read: int | None = Field(default=None, alias="bytesRead")
    commit: Literal["Immediate", "Deferred"] = "Immediate"
    # wall clock (seconds since the epoch) when a Deferred transition was prepared, and when
    # the transition began to change the live revision (its commit; one-step ones too)
    prepared_at: float | None = Field(default=None, alias="preparedAt")
    committed_at: float | None = Field(default=None, alias="committedAt")
    first_token_at: float | None = Field(default=None, alias="firstTokenAt")   # the new revision answered
    # a Deferred reload loaded its target beside the live revision while preparing (its
    # commit is a swap); false: no memory for both, the commit loads; null: not such a reload
    loaded_beside: bool | None = Field(default=None, alias="loadedBeside")
    # the reload swapped in the revision preloaded ahead of the switch (spec.stage.preload)
    preloaded: bool | None = None
    timings: Timings = Field(default_factory=Timings)


class GenerateRequest(Wire):
    prompt: str = Field(min_length=1, max_length=4096)
    max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS, alias="maxTokens")


class GenerateResponse(Wire):
    text: str
    tokens: list[int]
    identity: Identity
    first_token_seconds: float = Field(alias="firstTokenSeconds")


class ErrorResponse(Wire):
    error: str


def dump(model: BaseModel) -> bytes:
    return model.model_dump_json(by_alias=True).encode()
