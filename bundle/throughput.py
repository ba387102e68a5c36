"""How fast this node fetches from each source and copies locally, as the store measured it.

The planner needs two speeds to weigh a rebase on a store without reflink
(:mod:`bundle.rebase_cost`). Both are measured on real work, never by a probe:

- **fetch**, per source: each materialization times its fetches (from asking the source
  for a run of chunks to the last byte hashed and written) and records the bytes and
  seconds, keyed by :func:`source_key`;
- **copy**, one per store (:data:`COPY_KEY`): each materialization that copied donor
  chunks (no reflink) records the bytes and seconds of those in-kernel copies.

A probe would measure a file it had just written, read back from the page cache, not a
donor that may have left it long ago, and would cost I/O at every bridge start. The
price of measuring real work is that the first rebase on a new store has no copy speed
yet; it is then kept (as before this rule) and measures one.

Transfers under :data:`MIN_SAMPLE_BYTES` are not recorded: they measure request latency,
not throughput. The estimate is the median rate of the last :data:`KEEP` records of a
key, so one slow or cached outlier does not flip decisions. Records live in the store's
catalog (table ``throughput``) and survive restarts.
"""

from __future__ import annotations

import posixpath
import statistics
from urllib.parse import unquote, urlsplit

from .catalog import Catalog, now_ns
from .manifest import ManifestError
from .materialize import Tally
from .sources.hf import HfLocation
from .sources.s3 import S3Location

__all__ = ["source_key", "record", "estimate", "record_tally", "estimates", "COPY_KEY",
           "MIN_SAMPLE_BYTES", "KEEP"]

COPY_KEY = "local"
MIN_SAMPLE_BYTES = 4 << 20
KEEP = 9
KINDS = ("fetch", "copy")


def source_key(uri: str | None) -> str | None:
    """Where a source's bytes come from: scheme, host[:port] and repository path.

    Never credentials, query or fragment. ``file:///a/b/rev`` → ``file:///a/b`` (a
    directory holds one bundle; its parent holds the revisions); ``http(s)://h/base`` →
    the base; ``oci://h/repo:tag`` → ``oci://h/repo``; ``s3://bucket/prefix?endpoint=E``
    → ``s3://bucket/prefix`` at the store (``@E``, or ``@aws:<region>``), since one bucket
    name on two servers is two places; ``hf://org/name@commit?endpoint=E`` → ``hf://org/name@E``.
    None for anything else.
    """
    if not isinstance(uri, str):
        return None
    if uri.startswith("s3://"):
        try:
            loc = S3Location.parse(uri)
        except ManifestError:
            return None
        return f"s3://{loc.bucket}/{loc.prefix}".rstrip("/") + f"@{loc.endpoint or 'aws:' + loc.region}"
    if uri.startswith("hf://"):
        try:
            hf = HfLocation.parse(uri)
        except ManifestError:
            return None
        return f"hf://{hf.repo_id}@{hf.endpoint}"   # every commit of a repository comes from one place
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    path = unquote(parts.path).rstrip("/")
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    if scheme == "file":
        return f"file://{posixpath.dirname(path) or '/'}"
    if scheme in ("http", "https") and host:
        return f"{scheme}://{netloc}{path}"
    if scheme in ("oci", "oci+http", "oci+https") and host:
        repo = path.split("@", 1)[0]
        head, _, last = repo.rpartition("/")
        return f"{scheme}://{netloc}{head}/{last.split(':', 1)[0]}"
    return None


def record(catalog: Catalog, kind: str, key: str | None, nbytes: int, seconds: float) -> bool:
    """Remember one transfer; keep the last :data:`KEEP` of ``(kind, key)``.

    Returns whether it was recorded (not without a key, under the minimum size, or with
    no measurable time).
    """
    if kind not in KINDS:
        raise ValueError(f"throughput kind {kind!r} must be one of {', '.join(KINDS)}")
    if key is None or nbytes < MIN_SAMPLE_BYTES or seconds <= 0:
        return False
    with catalog.write() as db:
        db.execute("INSERT INTO throughput VALUES (?,?,?,?,?)",
                   (kind, key, int(nbytes), float(seconds), now_ns()))
        db.execute("DELETE FROM throughput WHERE kind=? AND key=? AND rowid NOT IN "
                   "(SELECT rowid FROM throughput WHERE kind=? AND key=? "
                   " ORDER BY at_ns DESC, rowid DESC LIMIT ?)", (kind, key, kind, key, KEEP))
    return True


def estimate(catalog: Catalog, kind: str, key: str | None) -> float | None:
    """The median bytes/s of the recent records of ``(kind, key)``; None if there are none."""
    if key is None:
        return None
    with catalog.read() as db:
        rows = db.execute("SELECT bytes, seconds FROM throughput WHERE kind=? AND key=?",
                          (kind, key)).fetchall()
    return statistics.median(b / s for b, s in rows) if rows else None


def record_tally(catalog: Catalog, source_uri: str | None, tally: Tally) -> None:
    """Record what one materialization fetched from ``source_uri`` and copied locally."""
    record(catalog, "fetch", source_key(source_uri), tally.fetched, tally.fetch_seconds)
    record(catalog, "copy", COPY_KEY, tally.copied, tally.copy_seconds)


def estimates(catalog: Catalog, source_uri: str | None) -> tuple[float | None, float | None]:
    """(fetch bytes/s from ``source_uri``, local copy bytes/s); None where never measured."""
    return (estimate(catalog, "fetch", source_key(source_uri)),
            estimate(catalog, "copy", COPY_KEY))
