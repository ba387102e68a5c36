"""The bridge's durable record of volumes and deliveries on this node (SQLite).

Leases that pin content live in the bundle store's own database; this one records what
the bridge did with that content, so a restarted bridge can reconcile:

- a *publication* is one CSI volume published at one target path: the kubelet volume id,
  the volume directory it bind-mounted, the revision digest, the Pod it belongs to and a
  state, ``publishing`` while work is under way and ``published`` once the read-only
  mount is verified. It is keyed by target path: one thing is mounted on a target.
- a *delivery* is one BundleDelivery object served into a publication's volume:
  ``staging``, ``staged`` or ``failed``, with the generation it answers and the status
  it reported (kept so a restarted bridge reports the same byte counts again).
- a *fetch failure* is the last failed attempt to bring a revision into the store for a
  publish: the gRPC code and message kubelet was (or will be) answered with, and how many
  attempts failed in a row. A successful fetch removes it. While a retry runs, the publish
  answers with this failure instead of "in progress", so kubelet's FailedMount keeps
  naming the cause.
- a *possession* records that a namespace's source really served a bundle's manifest
  (csi_bridge/possession.py): the right to mount content the store already holds.

The file is opened in WAL mode with one connection shared under a lock: the bridge's
writes are few and small, and a crash between two statements leaves each row whole.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS publications (
    target_path   TEXT PRIMARY KEY,
    volume_id     TEXT NOT NULL,
    volume_dir    TEXT NOT NULL,
    digest        TEXT NOT NULL,
    source        TEXT NOT NULL,
    model         TEXT NOT NULL DEFAULT '',
    pod_uid       TEXT NOT NULL DEFAULT '',
    pod_namespace TEXT NOT NULL DEFAULT '',
    pod_name      TEXT NOT NULL DEFAULT '',
    state         TEXT NOT NULL CHECK (state IN ('publishing', 'published', 'unpublishing')),
    updated       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS publications_volume ON publications (volume_id);
CREATE INDEX IF NOT EXISTS publications_pod ON publications (pod_uid);
CREATE TABLE IF NOT EXISTS deliveries (
    uid         TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    target_path TEXT NOT NULL,
    digest      TEXT NOT NULL,
    generation  INTEGER NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('staging', 'staged', 'failed')),
    status_json TEXT NOT NULL DEFAULT '{}',
    updated     REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fetch_failures (
    digest   TEXT PRIMARY KEY,
    source   TEXT NOT NULL,
    code     TEXT NOT NULL,
    message  TEXT NOT NULL,
    failures INTEGER NOT NULL,
    updated  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS possessions (
    namespace TEXT NOT NULL,
    source    TEXT NOT NULL,
    digest    TEXT NOT NULL,
    verified  REAL NOT NULL,
    PRIMARY KEY (namespace, source, digest)
);
"""


@dataclass(frozen=True)
class Publication:
    target_path: str
    volume_id: str
    volume_dir: str
    digest: str
    source: str
    model: str = ""
    pod_uid: str = ""
    pod_namespace: str = ""
    pod_name: str = ""
    state: str = "publishing"
    updated: float = 0.0


@dataclass(frozen=True)
class Delivery:
    uid: str
    namespace: str
    name: str
    target_path: str
    digest: str
    generation: int
    state: str
    status_json: str = "{}"
    updated: float = 0.0


@dataclass(frozen=True)
class FetchFailure:
    digest: str
    source: str
    code: str          # a grpc.StatusCode name
    message: str
    failures: int = 1
    updated: float = 0.0


class BridgeState:
    """Rows of publications and deliveries; every method is one transaction."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def ping(self) -> None:
        """Raise sqlite3.Error if the database cannot be read."""
        with self._lock:
            self._db.execute("SELECT count(*) FROM publications").fetchone()

    # -- publications ------------------------------------------------------------------
    def put_publication(self, p: Publication) -> Publication:
        p = Publication(**{**_row(p), "updated": time.time()})
        cols = [f.name for f in fields(Publication)]
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO publications ({','.join(cols)}) "
                f"VALUES ({','.join('?' * len(cols))})", [getattr(p, c) for c in cols])
        return p

    def set_publication_state(self, target_path: str, state: str) -> None:
        with self._lock:
            self._db.execute("UPDATE publications SET state=?, updated=? WHERE target_path=?",
                             (state, time.time(), target_path))

    def publication(self, target_path: str) -> Publication | None:
        rows = self._select(Publication, "publications", "target_path=?", (target_path,))
        return rows[0] if rows else None

    def publications(self, where: str = "1", args: tuple = ()) -> list[Publication]:
        return self._select(Publication, "publications", where, args)

    def publications_of_pod(self, pod_uid: str) -> list[Publication]:
        return self.publications("pod_uid=? AND state='published'", (pod_uid,))

    def delete_publication(self, target_path: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM publications WHERE target_path=?", (target_path,))

    # -- deliveries --------------------------------------------------------------------
    def put_delivery(self, d: Delivery) -> Delivery:
        d = Delivery(**{**_row(d), "updated": time.time()})
        cols = [f.name for f in fields(Delivery)]
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO deliveries ({','.join(cols)}) "
                f"VALUES ({','.join('?' * len(cols))})", [getattr(d, c) for c in cols])
        return d

    def delivery(self, uid: str) -> Delivery | None:
        rows = self._select(Delivery, "deliveries", "uid=?", (uid,))
        return rows[0] if rows else None

    def deliveries(self) -> list[Delivery]:
        return self._select(Delivery, "deliveries", "1", ())

    def delete_delivery(self, uid: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM deliveries WHERE uid=?", (uid,))

    # -- fetch failures ----------------------------------------------------------------
    def record_fetch_failure(self, digest: str, source: str, code: str, message: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO fetch_failures VALUES (?,?,?,?,1,?) ON CONFLICT(digest) DO UPDATE "
                "SET source=excluded.source, code=excluded.code, message=excluded.message, "
                "failures=failures+1, updated=excluded.updated",
                (digest, source, code, message, time.time()))

    def fetch_failure(self, digest: str) -> FetchFailure | None:
        rows = self._select(FetchFailure, "fetch_failures", "digest=?", (digest,))
        return rows[0] if rows else None

    def clear_fetch_failure(self, digest: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM fetch_failures WHERE digest=?", (digest,))

    # -- possessions -------------------------------------------------------------------
    def proven(self, namespace: str, source: str, digest: str) -> bool:
        with self._lock:
            return self._db.execute(
                "SELECT 1 FROM possessions WHERE namespace=? AND source=? AND digest=?",
                (namespace, source, digest)).fetchone() is not None

    def record_proof(self, namespace: str, source: str, digest: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO possessions VALUES (?, ?, ?, ?)",
                             (namespace, source, digest, time.time()))

    def _select(self, cls, table: str, where: str, args: tuple) -> list:
        cols = [f.name for f in fields(cls)]
        with self._lock:
            rows = self._db.execute(f"SELECT {','.join(cols)} FROM {table} WHERE {where}",
                                    args).fetchall()
        return [cls(**dict(zip(cols, r))) for r in rows]


def _row(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}
