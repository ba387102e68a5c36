"""The node store's catalog: what is stored, what is being built, and what is pinned.

One SQLite database in WAL mode (readers never block the writer; it survives restarts):

- ``blobs``: content in the store, by content key (see :func:`bundle.plan.content_key`),
  with its size. The sum of sizes is the store's usage.
- ``revisions``: revision trees by bundle digest, ``staging`` while a materialization
  builds one and ``ready`` once it is published in the store, with a last-used time
  for LRU garbage collection.
- ``revision_blobs``: which blobs a revision (ready or staging) is made of. GC deletes a
  blob only when no revision refers to it, so a materialization that has registered its
  target can rely on every blob it found.
- ``leases``: ``holder -> digest``. A leased revision is never collected. A holder holds
  one lease; materializations pin their donor with a ``work:<token>`` holder.
- ``work``: materializations in flight, by token; each holds an flock on its token file
  while it lives, so a reopened store can tell abandoned work from running work.
- ``throughput``: recent fetch and local-copy speeds the store measured, by source
  (see :mod:`bundle.throughput`); the planner weighs a rebase with them when the store
  cannot clone.

Writers use ``BEGIN IMMEDIATE``, so GC and lease acquisition are serialized: a lease
taken after GC decided to remove a revision sees the revision gone (and says so), and
GC never removes a revision leased before it looked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from pathlib import Path
from typing import Iterator

SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
  key TEXT PRIMARY KEY, size INTEGER NOT NULL, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS revisions (
  digest TEXT PRIMARY KEY, state TEXT NOT NULL CHECK (state IN ('staging', 'ready')),
  bytes INTEGER NOT NULL, token TEXT, created_ns INTEGER NOT NULL, last_used_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS revision_blobs (
  digest TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (digest, key));
CREATE INDEX IF NOT EXISTS revision_blobs_by_key ON revision_blobs (key);
CREATE TABLE IF NOT EXISTS leases (
  holder TEXT PRIMARY KEY, digest TEXT NOT NULL, created_ns INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS leases_by_digest ON leases (digest);
CREATE TABLE IF NOT EXISTS work (
  token TEXT PRIMARY KEY, digest TEXT NOT NULL, pid INTEGER NOT NULL, started_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS throughput (
  kind TEXT NOT NULL CHECK (kind IN ('fetch', 'copy')), key TEXT NOT NULL,
  bytes INTEGER NOT NULL, seconds REAL NOT NULL, at_ns INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS throughput_by_key ON throughput (kind, key, at_ns);
"""


def now_ns() -> int:
    return time.time_ns()


class Catalog:
    """Typed access to the store database; every method is one short transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Switching to WAL takes an exclusive lock that SQLite's busy handler does not wait
        # for: two processes opening a new store at once would see "database is locked".
        lock = os.open(f"{path}.init.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            db = self._connect()  # (a Connection's own context manager does not close it)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(SCHEMA)
            finally:
                db.close()
        finally:
            os.close(lock)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=60000")
        return db

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """An IMMEDIATE transaction: committed on success, rolled back on any exception."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            yield db
        finally:
            db.close()

    # -- revisions ------------------------------------------------------------------
    def revision_state(self, digest: str) -> str | None:
        with self.read() as db:
            row = db.execute("SELECT state FROM revisions WHERE digest=?", (digest,)).fetchone()
        return row[0] if row else None

    def touch(self, digest: str) -> None:
        with self.write() as db:
            db.execute("UPDATE revisions SET last_used_ns=? WHERE digest=?", (now_ns(), digest))

    def begin_work(self, token: str, digest: str, pid: int, size: int, keys: set[str],
                   donor: str | None) -> bool:
        """Register a materialization: staging row, its blob refs, and a pin on the donor.

        Returns False (registering nothing) if ``donor`` is no longer a ready revision.
        The caller holds the digest's lock, so a staging row left for it is abandoned.
        """
        t = now_ns()
        with self.write() as db:
            if donor:
                row = db.execute("SELECT state FROM revisions WHERE digest=?", (donor,)).fetchone()
                if not row or row[0] != "ready":
                    return False
                db.execute("INSERT INTO leases VALUES (?,?,?)", (f"work:{token}", donor, t))
            db.execute("DELETE FROM revision_blobs WHERE digest=? AND digest IN "
                       "(SELECT digest FROM revisions WHERE state='staging')", (digest,))
            db.execute("DELETE FROM revisions WHERE digest=? AND state='staging'", (digest,))
            db.execute("INSERT INTO work VALUES (?,?,?,?)", (token, digest, pid, t))
            db.execute("INSERT INTO revisions VALUES (?,?,?,?,?,?)",
                       (digest, "staging", size, token, t, t))
            db.executemany("INSERT OR IGNORE INTO revision_blobs VALUES (?,?)",
                           [(digest, k) for k in keys])
        return True

    def finish_work(self, token: str, digest: str, publish: bool) -> None:
        """Mark the revision ready (``publish``) or forget it; drop the work and its pin."""
        with self.write() as db:
            if publish:
                db.execute("UPDATE revisions SET state='ready', token=NULL, last_used_ns=? "
                           "WHERE digest=? AND token=?", (now_ns(), digest, token))
            else:
                self._forget_staging(db, token)
            db.execute("DELETE FROM leases WHERE holder=?", (f"work:{token}",))
            db.execute("DELETE FROM work WHERE token=?", (token,))

    @staticmethod
    def _forget_staging(db: sqlite3.Connection, token: str) -> None:
        for (digest,) in db.execute("SELECT digest FROM revisions WHERE token=? AND state='staging'",
                                    (token,)).fetchall():
            db.execute("DELETE FROM revision_blobs WHERE digest=?", (digest,))
            db.execute("DELETE FROM revisions WHERE digest=?", (digest,))

    def abandoned_work(self) -> list[tuple[str, str]]:
        with self.read() as db:
            return db.execute("SELECT token, digest FROM work").fetchall()

    def forget_work(self, token: str) -> None:
        with self.write() as db:
            self._forget_staging(db, token)
            db.execute("DELETE FROM leases WHERE holder=?", (f"work:{token}",))
            db.execute("DELETE FROM work WHERE token=?", (token,))

    def staging_without_work(self) -> list[str]:
        with self.read() as db:
            return [r[0] for r in db.execute(
                "SELECT digest FROM revisions WHERE state='staging' "
                "AND (token IS NULL OR token NOT IN (SELECT token FROM work))")]

    def drop_revision(self, digest: str) -> None:
        with self.write() as db:
            db.execute("DELETE FROM revision_blobs WHERE digest=?", (digest,))
            db.execute("DELETE FROM revisions WHERE digest=?", (digest,))

    def ready_revisions(self) -> list[str]:
        with self.read() as db:
            return [r[0] for r in db.execute("SELECT digest FROM revisions WHERE state='ready'")]

    # -- blobs ----------------------------------------------------------------------
    def add_blob(self, key: str, size: int) -> None:
        with self.write() as db:
            db.execute("INSERT OR IGNORE INTO blobs VALUES (?,?,?)", (key, size, now_ns()))

    def has_blob(self, key: str) -> bool:
        with self.read() as db:
            return db.execute("SELECT 1 FROM blobs WHERE key=?", (key,)).fetchone() is not None

    def blob_keys(self) -> set[str]:
        with self.read() as db:
            return {r[0] for r in db.execute("SELECT key FROM blobs")}

    def drop_blob(self, key: str) -> None:
        with self.write() as db:
            db.execute("DELETE FROM blobs WHERE key=?", (key,))

    def usage_bytes(self) -> int:
        with self.read() as db:
            return int(db.execute("SELECT COALESCE(SUM(size), 0) FROM blobs").fetchone()[0])

    def reclaimable_bytes(self) -> int:
        """Bytes GC could remove now: blobs no leased or staging revision refers to."""
        with self.read() as db:
            return int(db.execute(
                "SELECT COALESCE(SUM(size), 0) FROM blobs WHERE key NOT IN "
                "(SELECT key FROM revision_blobs WHERE digest IN (SELECT digest FROM leases) "
                "OR digest IN (SELECT digest FROM revisions WHERE state='staging'))").fetchone()[0])

    # -- leases ---------------------------------------------------------------------
    def leases(self) -> list[tuple[str, str, int]]:
        with self.read() as db:
            return db.execute("SELECT holder, digest, created_ns FROM leases "
                              "WHERE holder NOT LIKE 'work:%' ORDER BY holder").fetchall()
