"""The bundle manifest: what a model revision is, byte for byte.

A bundle is a directory of files plus this manifest. Each file entry carries its
relative path, size, sha256, role (graph, weights, config, tokenizer) and, for files
larger than one chunk, the sha256 of each chunk. Chunks are fixed-size slices of the
file, or, where the entry lists ``offsets`` (where each chunk starts), pieces of at most
the chunk size cut at a safetensors file's tensors (:mod:`bundle.chunking`). The manifest
is serialized canonically (sorted keys, no whitespace, files sorted by path; ``offsets``
only where there are some), and the sha256 of that serialization is the bundle digest:
the model's identity.

Parsing is strict because a manifest names paths that will be written on a node: absolute
paths, ``..``, empty or duplicate paths, and malformed sizes or digests are rejected with
a :class:`ManifestError` that says which entry is wrong and why.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import posixpath
import re
from enum import Enum
from typing import Annotated, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
HEX_RE = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024  # a multiple of every filesystem block size we clone
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_FILES = 100_000
MANIFEST_NAME = "resident-manifest.json"


class ManifestError(ValueError):
    """A manifest (or a directory being turned into one) is not acceptable."""


class Role(str, Enum):
    graph = "graph"
    weights = "weights"
    config = "config"
    tokenizer = "tokenizer"


Hex = Annotated[str, Field(pattern=HEX_RE.pattern)]


def check_relative_path(path: str) -> str:
    """Return ``path`` if it is a safe, normalized, relative POSIX path; raise otherwise."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise ManifestError(f"path {path!r} must be relative, non-empty, POSIX, without NUL")
    if posixpath.normpath(path) != path or path in (".",):
        raise ManifestError(f"path {path!r} is not normalized")
    if any(part == ".." for part in path.split("/")):
        raise ManifestError(f"path {path!r} escapes the bundle with '..'")
    if path == MANIFEST_NAME:
        raise ManifestError(f"path {path!r} is reserved for the manifest itself")
    return path


class FileEntry(BaseModel):
    """One regular file of a bundle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    size: int = Field(ge=0)
    sha256: Hex
    role: Role
    chunks: tuple[Hex, ...] = ()
    offsets: tuple[int, ...] = ()   # where each chunk starts; () for fixed-size slices

    @field_validator("path")
    @classmethod
    def _safe_path(cls, v: str) -> str:
        return check_relative_path(v)

    @model_validator(mode="after")
    def _offsets_cut_the_file(self) -> "FileEntry":
        o = self.offsets
        if o and (len(o) != len(self.chunks) or o[0] != 0 or o[-1] >= self.size
                  or any(b <= a for a, b in zip(o, o[1:]))):
            raise ValueError(f"{self.path!r}: offsets must start at 0, rise, stay below the size "
                             f"{self.size} and name one start per chunk ({len(self.chunks)})")
        return self


class Manifest(BaseModel):
    """A bundle manifest. ``digest`` is the sha256 of :meth:`canonical_json`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(default=1, alias="schemaVersion")
    chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, alias="chunkSize", gt=0)
    files: tuple[FileEntry, ...]

    @model_validator(mode="after")
    def _consistent(self) -> "Manifest":
        if self.schema_version != 1:
            raise ValueError(f"unsupported schemaVersion {self.schema_version}")
        if self.chunk_size % 4096:
            raise ValueError(f"chunkSize {self.chunk_size} is not a multiple of 4096")
        if len(self.files) > MAX_FILES:
            raise ValueError(f"{len(self.files)} files exceed the limit of {MAX_FILES}")
        seen: set[str] = set()
        dirs: set[str] = set()
        for f in self.files:
            if f.path in seen:
                raise ValueError(f"duplicate path {f.path!r}")
            seen.add(f.path)
            parent = posixpath.dirname(f.path)
            while parent:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
            if f.offsets:
                longest = max(b - a for a, b in zip(f.offsets, (*f.offsets[1:], f.size)))
                if f.size <= self.chunk_size or longest > self.chunk_size:
                    raise ValueError(f"{f.path!r}: chunks cut at offsets must be at most "
                                     f"{self.chunk_size} bytes, in a file larger than that")
                continue
            want = n_chunks(f.size, self.chunk_size)
            if len(f.chunks) != want:
                raise ValueError(
                    f"{f.path!r}: {len(f.chunks)} chunk digests for size {f.size}, expected {want}")
        clash = seen & dirs
        if clash:
            raise ValueError(f"path {sorted(clash)[0]!r} is both a file and a directory")
        return self

    # -- serialization -------------------------------------------------------------
    def canonical_json(self) -> bytes:
        return self._canonical

    @functools.cached_property
    def _canonical(self) -> bytes:  # computed once: the model is frozen
        doc = self.model_dump(mode="json", by_alias=True)
        for f in doc["files"]:   # fixed slices serialize as before offsets existed
            if not f["offsets"]:
                del f["offsets"]
        doc["files"] = sorted(doc["files"], key=lambda f: f["path"])
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @functools.cached_property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_json()).hexdigest()

    @classmethod
    def parse(cls, data: bytes | str) -> "Manifest":
        raw = data.encode() if isinstance(data, str) else data
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"manifest is {len(raw)} bytes, over the limit of {MAX_MANIFEST_BYTES}")
        try:
            return cls.model_validate_json(raw)
        except ValidationError as e:
            raise ManifestError(_explain(e)) from None

    # -- views ---------------------------------------------------------------------
    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def files_with(self, *roles: Role) -> list[FileEntry]:
        return [f for f in self.files if f.role in roles]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def role_digest(self, *roles: Role) -> str:
        """Digest of the (path, sha256) pairs of the files with these roles."""
        pairs = sorted((f.path, f.sha256) for f in self.files_with(*roles))
        return "sha256:" + hashlib.sha256(json.dumps(pairs).encode()).hexdigest()

    @property
    def graph_digest(self) -> str:
        """Identity of what a runtime compiles: graph and config files."""
        return self.role_digest(Role.graph, Role.config)

    @property
    def weights_digest(self) -> str:
        return self.role_digest(Role.weights)

    def identity(self) -> dict[str, str]:
        return {"bundle": self.digest, "graph": self.graph_digest, "weights": self.weights_digest}


def n_chunks(size: int, chunk_size: int) -> int:
    """Files up to one chunk carry no chunk list; larger ones carry ceil(size/chunk)."""
    return 0 if size <= chunk_size else -(-size // chunk_size)


def chunk_range(entry: FileEntry, index: int, chunk_size: int) -> tuple[int, int]:
    """(offset, length) of chunk ``index`` of ``entry``."""
    if entry.offsets:
        off = entry.offsets[index]
        end = entry.offsets[index + 1] if index + 1 < len(entry.offsets) else entry.size
        return off, end - off
    off = index * chunk_size
    return off, min(chunk_size, entry.size - off)


def cut_alike(a: FileEntry, a_chunk_size: int, b: FileEntry, b_chunk_size: int) -> bool:
    """Whether chunk i of ``a`` (in a manifest of ``a_chunk_size``) covers the same bytes as
    chunk i of ``b``, for every i: the same size, cut the same way."""
    if a.size != b.size or bool(a.chunks) != bool(b.chunks) or a.offsets != b.offsets:
        return False
    return bool(a.offsets) or not a.chunks or a_chunk_size == b_chunk_size


def chunk_starting_at(entry: FileEntry, offset: int, chunk_size: int) -> int | None:
    """The index of the chunk of ``entry`` that starts at ``offset`` (None: none does)."""
    if entry.offsets:
        i = bisect.bisect_left(entry.offsets, offset)
        return i if i < len(entry.offsets) and entry.offsets[i] == offset else None
    i = offset // chunk_size
    return i if i * chunk_size == offset else None


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise ManifestError(f"digest {digest!r} is not of the form sha256:<64 lowercase hex>")
    return digest


def _explain(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid manifest: " + "; ".join(parts)


def build_entries(files: Iterable[FileEntry], chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    try:
        return Manifest(files=tuple(sorted(files, key=lambda f: f.path)), chunkSize=chunk_size)
    except ValidationError as e:
        raise ManifestError(_explain(e)) from None


def revision_dirname(digest: str) -> str:
    """Directory name of a revision in stores and volumes: ``sha256-<hex>``."""
    return check_digest(digest).replace(":", "-", 1)
