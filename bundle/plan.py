"""Diff two manifests and plan how a node gets from the donor revision to the target.

A *delivery plan* is pure: it looks only at the target manifest and, if the node already
holds one, a donor manifest. It answers:

- the **path**: ``GraphOnly`` when the donor already carries every weights and tokenizer
  file of the target (only graph and config files move), otherwise ``WholeBundle``;
- the **method**: ``graph-only``, ``rebase`` (build the target on the donor: hardlink
  identical files, clone identical chunks, fetch only what changed) or ``reconstruct``
  (fetch and write every byte);
- per file, what happens to it: ``link`` (identical file in the donor), ``rebase``
  (some chunks cloned from the donor, the others fetched) or ``fetch`` (all bytes);
- the predicted bytes: fetched from the source, reused from the donor, written to disk,
  and the reuse fraction (reused / total target bytes).

*Rebase admission*: a rebase that would reuse less than ``min_reuse`` of the target is
refused and the plan falls back to reconstruct, with the reason in ``fallback_reason``.
On a store without reflink, an admitted rebase is then weighed against a reconstruct by
measured throughputs (:mod:`bundle.rebase_cost`); ``cost_reason`` says what that found.

Files are identical when their *content keys* are equal (see :func:`content_key`): the
sha256 for single-chunk files, and a digest of size and chunk digests for larger ones, so
that identity always follows from bytes that are verified chunk by chunk.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Literal

from .errors import PlanError
from .manifest import FileEntry, Manifest, Role, chunk_range
from .rebase_cost import decide_rebase

__all__ = ["plan_delivery", "DeliveryPlan", "FilePlan", "ChunkClone", "PlanError", "content_key",
           "MODES", "REBASE_MODES"]

MODES = ("Auto", "GraphOnly", "WholeBundle")
REBASE_MODES = ("Auto", "Never")
#: roles that must be identical in the donor for a graph-only delivery
RESIDENT_ROLES = (Role.weights, Role.tokenizer)


def content_key(entry: FileEntry, chunk_size: int) -> str:
    """The store name of a file's content (64 hex).

    A file of at most one chunk is named by its sha256. A larger file is named by the
    sha256 of its size and chunk digests: the store verifies chunks, never re-hashes whole
    large files, so the name must follow from what was verified.
    """
    if not entry.chunks:
        return entry.sha256
    text = f"resident-chunks:{chunk_size}:{entry.size}:" + ",".join(entry.chunks)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ChunkClone:
    """Chunk ``index`` of a target file is byte-identical to ``length`` bytes of a donor file."""

    index: int
    donor_path: str
    donor_offset: int
    length: int


@dataclass(frozen=True)
class FilePlan:
    """What happens to one target file."""

    path: str
    size: int
    action: Literal["link", "rebase", "fetch"]
    donor_path: str | None = None          # for "link": the identical donor file
    clones: tuple[ChunkClone, ...] = ()    # for "rebase": chunks taken from the donor
    fetch_chunks: tuple[int, ...] = ()     # for "rebase": chunk indexes fetched from the source

    @property
    def reuse_bytes(self) -> int:
        if self.action == "link":
            return self.size
        return sum(c.length for c in self.clones)

    @property
    def fetch_bytes(self) -> int:
        return self.size - self.reuse_bytes

    @property
    def clone_bytes(self) -> int:
        return sum(c.length for c in self.clones)


@dataclass(frozen=True)
class DeliveryPlan:
    """How to deliver ``target_digest`` onto a node holding ``donor_digest`` (or nothing)."""

    target_digest: str
    donor_digest: str | None
    path: Literal["GraphOnly", "WholeBundle"]
    method: Literal["graph-only", "rebase", "reconstruct"]
    files: tuple[FilePlan, ...]
    total_bytes: int
    fetch_bytes: int
    reuse_bytes: int
    write_bytes: int
    reuse_fraction: float
    fallback_reason: str | None = None
    reflink: bool = True
    #: the reuse fraction a rebase would have had (also when admission refused it)
    rebase_reuse_fraction: float | None = None
    #: without reflink: why copying donor chunks was (not) judged cheaper than fetching
    cost_reason: str | None = None
    identical_files: list[str] = field(default_factory=list)
    cloned_chunks: dict[str, int] = field(default_factory=dict)
    changed_chunks: dict[str, list[int]] = field(default_factory=dict)

    def to_status(self) -> dict:
        """The plan as BundleDelivery / ResidentModel status (camelCase keys)."""
        return {
            "path": self.path,
            "method": self.method,
            "reuseFraction": round(self.reuse_fraction, 6),
            "bytes": {"fetch": self.fetch_bytes, "reuse": self.reuse_bytes,
                      "write": self.write_bytes},
            "fallbackReason": self.fallback_reason,
            "costReason": self.cost_reason,
        }

    def describe(self) -> str:
        """A few human lines (used by ``resident bundle diff``)."""
        lines = [
            f"target   {self.target_digest}",
            f"donor    {self.donor_digest or '-'}",
            f"path     {self.path}",
            f"method   {self.method}" + (f"  (fallback: {self.fallback_reason})"
                                         if self.fallback_reason else ""),
            f"reuse    {self.reuse_fraction:.1%} of {self.total_bytes} bytes",
            f"bytes    fetch {self.fetch_bytes}  reuse {self.reuse_bytes}  "
            f"write {self.write_bytes}" + ("" if self.reflink else "  (no reflink: clones copied)"),
        ]
        if self.cost_reason and self.cost_reason != self.fallback_reason:
            lines.insert(4, f"cost     {self.cost_reason}")
        for fp in self.files:
            if fp.action == "link":
                lines.append(f"  link     {fp.path}  ({fp.size} bytes, identical)")
            elif fp.action == "rebase":
                lines.append(f"  rebase   {fp.path}  ({len(fp.clones)} chunks cloned, "
                             f"{len(fp.fetch_chunks)} fetched: {fp.fetch_bytes} bytes)")
            else:
                lines.append(f"  fetch    {fp.path}  ({fp.size} bytes)")
        return "\n".join(lines)


def _check_options(mode: str, rebase: str, min_reuse: float) -> None:
    if mode not in MODES:
        raise PlanError(f"delivery mode {mode!r} must be one of {'|'.join(MODES)}")
    if rebase not in REBASE_MODES:
        raise PlanError(f"rebase {rebase!r} must be one of {'|'.join(REBASE_MODES)}")
    if not isinstance(min_reuse, (int, float)) or not 0.0 <= float(min_reuse) <= 1.0:
        raise PlanError(f"minReuse {min_reuse!r} must be a number between 0 and 1")


def graph_only_blocker(target: Manifest, donor: Manifest | None) -> str | None:
    """Why graph-only is impossible (``None`` if it is possible)."""
    if donor is None:
        return "graph-only needs a donor revision on the node, and there is none"
    if target.chunk_size != donor.chunk_size:
        return (f"graph-only needs the same chunk size (target {target.chunk_size}, "
                f"donor {donor.chunk_size})")
    have = {(f.path, content_key(f, donor.chunk_size)) for f in donor.files_with(*RESIDENT_ROLES)}
    want = {(f.path, content_key(f, target.chunk_size)) for f in target.files_with(*RESIDENT_ROLES)}
    for path, _ in sorted(want - have):
        return f"graph-only impossible: {path} differs from the donor revision"
    for path, _ in sorted(have - want):
        return f"graph-only impossible: the donor has {path}, the target does not"
    return None


def _file_plans(target: Manifest, donor: Manifest) -> list[FilePlan]:
    """Per-file reuse of the donor: link identical files, clone identical chunks."""
    cs = target.chunk_size
    same_chunking = donor.chunk_size == cs
    donor_files: dict[str, str] = {}
    donor_chunks: dict[str, tuple[str, int, int]] = {}
    for d in donor.files:
        if same_chunking:
            donor_files.setdefault(content_key(d, cs), d.path)
            for i, digest in enumerate(d.chunks):
                off, length = chunk_range(d, i, cs)
                donor_chunks.setdefault(digest, (d.path, off, length))
    plans = []
    for f in target.files:
        same = donor_files.get(content_key(f, cs))
        if same is not None:
            plans.append(FilePlan(f.path, f.size, "link", donor_path=same))
            continue
        clones, fetch = [], []
        for i, digest in enumerate(f.chunks):
            hit = donor_chunks.get(digest)
            if hit and hit[2] == chunk_range(f, i, cs)[1]:
                clones.append(ChunkClone(i, hit[0], hit[1], hit[2]))
            else:
                fetch.append(i)
        if clones:
            plans.append(FilePlan(f.path, f.size, "rebase", clones=tuple(clones),
                                  fetch_chunks=tuple(fetch)))
        else:
            plans.append(FilePlan(f.path, f.size, "fetch"))
    return plans


def _assemble(target: Manifest, donor: Manifest | None, path: str, method: str,
              files: list[FilePlan], reflink: bool, fallback_reason: str | None = None,
              rebase_reuse: float | None = None, cost_reason: str | None = None) -> DeliveryPlan:
    total = target.total_bytes
    reuse = sum(fp.reuse_bytes for fp in files)
    fetch = total - reuse
    write = fetch + (0 if reflink else sum(fp.clone_bytes for fp in files))
    return DeliveryPlan(
        target_digest=target.digest, donor_digest=donor.digest if donor else None,
        path=path, method=method, files=tuple(files), total_bytes=total,
        fetch_bytes=fetch, reuse_bytes=reuse, write_bytes=write,
        reuse_fraction=(reuse / total) if total else 0.0,
        fallback_reason=fallback_reason, reflink=reflink, rebase_reuse_fraction=rebase_reuse,
        cost_reason=cost_reason,
        identical_files=[fp.path for fp in files if fp.action == "link"],
        cloned_chunks={fp.path: len(fp.clones) for fp in files if fp.clones},
        changed_chunks={fp.path: list(fp.fetch_chunks) for fp in files if fp.action == "rebase"},
    )


def plan_delivery(target: Manifest, donor: Manifest | None, *, mode: str = "Auto",
                  rebase: str = "Auto", min_reuse: float = 0.5, reflink: bool = True,
                  source_bps: float | None = None,
                  copy_bps: float | None = None) -> DeliveryPlan:
    """Plan delivering ``target`` onto a node that holds ``donor`` (or nothing).

    ``mode`` is the spec's ``delivery`` (Auto|GraphOnly|WholeBundle), ``rebase`` is
    Auto|Never, ``min_reuse`` the rebase admission threshold. ``reflink`` says whether
    cloned chunks cost no writes (XFS/btrfs) or are copied (ext4). Without reflink an
    admitted whole-bundle rebase is kept only if the fetch it saves takes longer at
    ``source_bps`` than the copy at ``copy_bps`` (bytes/s measured by the store; None is
    unknown, and keeps the rebase): see :mod:`bundle.rebase_cost`. Raises
    :class:`PlanError` for an impossible GraphOnly request or bad options.
    """
    _check_options(mode, rebase, min_reuse)
    blocker = graph_only_blocker(target, donor)
    if mode == "GraphOnly" and blocker:
        raise PlanError(blocker)
    if mode in ("Auto", "GraphOnly") and blocker is None:
        assert donor is not None
        return _assemble(target, donor, "GraphOnly", "graph-only", _file_plans(target, donor),
                         reflink)
    every_byte = [FilePlan(f.path, f.size, "fetch") for f in target.files]
    if donor is None or rebase == "Never":
        return _assemble(target, donor, "WholeBundle", "reconstruct", every_byte, reflink)
    rebased = _assemble(target, donor, "WholeBundle", "rebase", _file_plans(target, donor),
                        reflink)
    if rebased.total_bytes and rebased.reuse_fraction < min_reuse:
        reason = (f"rebase refused: it would reuse {rebased.reuse_fraction:.1%} of the target, "
                  f"under minReuse {float(min_reuse):.1%}; reconstructing")
        return _assemble(target, donor, "WholeBundle", "reconstruct", every_byte, reflink,
                         fallback_reason=reason, rebase_reuse=rebased.reuse_fraction)
    # Whole files equal to a donor file are linked by either method (the store is
    # content-addressed), so what a rebase saves is its chunk clones, which it copies here.
    linked = sum(fp.size for fp in rebased.files if fp.action == "link")
    clones = sum(fp.clone_bytes for fp in rebased.files)
    decision = decide_rebase(reflink=reflink, rebase_fetch_bytes=rebased.fetch_bytes,
                             reconstruct_fetch_bytes=rebased.total_bytes - linked,
                             copy_bytes=clones, source_bps=source_bps, copy_bps=copy_bps)
    if not decision.rebase:
        return _assemble(target, donor, "WholeBundle", "reconstruct", every_byte, reflink,
                         fallback_reason=decision.reason, rebase_reuse=rebased.reuse_fraction,
                         cost_reason=decision.reason)
    return replace(rebased, cost_reason=decision.reason)
