"""Peers: other nodes' stores as a source, in front of the origin (issue 30).

A node that needs a revision another node already holds can read it from that node's
bridge instead of the origin. A *peer* (:class:`PeerSource`) is one such bridge, reached
over HTTP with a ServiceAccount token (``Authorization: Bearer``); it serves the
revisions its store holds (:mod:`csi_bridge.peer_server`)::

    /v1/manifests/sha256-<hex>.json   the manifest of a revision the store holds
    /v1/blobs/<content key>           a file's content, by its store name
                                      (:func:`bundle.plan.content_key`), with ``Range``

:class:`PeeredSource` puts peers in front of the origin for one revision:

- the manifest comes from the first peer whose bytes hash to the digest, or the origin;
- the chunks come from peers in *segments* (``segment_bytes`` of consecutive chunks, one
  ranged request each: a request per chunk cost twice the CPU of the origin's reads in
  experiments/17), spread over the peers by segment, several in flight at once; every
  chunk is hashed against the manifest *before* it is handed on;
- a peer that serves a chunk whose hash is wrong is marked corrupt and not asked again
  for this revision; a peer that fails (refused, gone, dead mid-transfer) is marked down:
  only its unfinished segments are lost, and they go to the next peer or the origin;
- a busy peer (503: at its transfer limit) is not dropped: the segment goes to the next
  peer, and when every holder is busy it waits a moment and asks again; a peer busy for
  ``BUSY_DROP_SECONDS`` without serving a segment is dropped;
- the origin serves what no peer could: peer trouble is never worse than no peers.

It counts the bytes each place sent (:attr:`PeeredSource.tally`), so a delivery can say
how much came from the origin and how much from peers.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator

import requests

from ..errors import IntegrityMismatch, SourceUnavailable
from ..manifest import MAX_MANIFEST_BYTES, FileEntry, Manifest, chunk_range, chunk_starting_at
from ..plan import content_key
from .ranged import RangedReader, RetryPolicy
from .source import Source, check_range, verify_manifest

log = logging.getLogger("resident.bundle.peers")

#: a peer is another node on the cluster network: fail fast, then go elsewhere
PEER_POLICY = RetryPolicy(attempts=2, backoff_seconds=0.1, connect_timeout_seconds=2.0,
                          read_timeout_seconds=10.0)
SEGMENT_BYTES = 8 << 20     # one request to a peer asks for this much (whole chunks)
BUSY_POLL_SECONDS = 0.2     # a segment whose every holder is busy asks again after this
BUSY_DROP_SECONDS = 10.0    # a holder busy this long without serving a segment is dropped


def _busy(error: BaseException) -> bool:
    """Whether a peer's failure is its 503: at its transfer limit (or unable to review the
    token just now), so it is there and may serve the chunk a moment later."""
    seen: BaseException | None = error
    while seen is not None:
        if "HTTP 503" in str(seen):
            return True
        seen = seen.__cause__
    return False


class _Bearer(requests.auth.AuthBase):
    """The token read afresh for each request: kubelet rotates projected tokens."""

    def __init__(self, token: Callable[[], str]) -> None:
        self.token = token

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = f"Bearer {self.token()}"
        return r


class PeerSource(Source):
    """One peer bridge at ``address`` (``host:port``)."""

    scheme = "peer"

    def __init__(self, node: str, address: str, token: Callable[[], str], chunk_size: int | None = None,
                 policy: RetryPolicy = PEER_POLICY) -> None:
        super().__init__(f"http://{address}/v1")
        self.node, self.chunk_size = node, chunk_size
        self.session = requests.Session()
        self.session.trust_env = False       # a peer is reached directly, never through a proxy
        self.session.auth = _Bearer(token)
        self.reader = RangedReader(self.session, policy, self.scheme)

    def manifest_bytes(self, digest: str) -> bytes:
        return self.reader.get_small(f"{self.uri}/manifests/{digest.replace(':', '-', 1)}.json",
                                     MAX_MANIFEST_BYTES)

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        """``chunk_size`` (the manifest's) names the blob; :class:`PeeredSource` sets it."""
        check_range(entry, offset, length)
        if self.chunk_size is None:
            raise SourceUnavailable(f"peer {self.node}: the manifest's chunk size is not known yet")
        return self.reader.read(f"{self.uri}/blobs/{content_key(entry, self.chunk_size)}", offset, length,
                                entry.path, entry.sha256)

    def close(self) -> None:
        self.session.close()


@dataclass
class PeerTally:
    """Bytes by where they came from, and the peers dropped for this revision."""

    origin: int = 0
    peers: dict[str, int] = field(default_factory=dict)    # node -> bytes
    down: dict[str, str] = field(default_factory=dict)     # node -> why it was dropped
    corrupt: list[str] = field(default_factory=list)       # nodes that served a wrong chunk

    @property
    def from_peers(self) -> int:
        return sum(self.peers.values())


class PeeredSource(Source):
    """One revision's bytes from ``peers`` first and ``origin`` last; see the module. Its
    manifest (:meth:`fetch_manifest`) comes first: until then every read is the origin's."""

    def __init__(self, origin: Source, peers: list[PeerSource], parallel: int = 4,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        super().__init__(origin.uri)
        self.scheme = origin.scheme      # metrics and messages name the origin's kind
        self.origin, self.peers = origin, list(peers)
        self.chunk_size: int | None = None
        self.parallel = max(1, parallel)
        self.segment_bytes = segment_bytes
        self.tally = PeerTally()
        self._busy_since: dict[str, float] = {}   # node -> when it began answering busy
        self._lock = threading.Lock()

    # -- the manifest --------------------------------------------------------------------
    def manifest_bytes(self, digest: str) -> bytes:
        return self.origin.manifest_bytes(digest)

    def fetch_manifest(self, digest: str) -> Manifest:
        manifest = None
        for peer in self._usable(0):
            try:
                manifest = verify_manifest(peer.manifest_bytes(digest), digest, f"peer {peer.node}")
                break
            except IntegrityMismatch as e:
                self._drop(peer, f"served a manifest that does not hash to the digest: {e}", corrupt=True)
            except (SourceUnavailable, requests.RequestException, OSError) as e:
                if not _busy(e):   # a busy peer keeps its chunks' turn; the manifest goes on
                    self._drop(peer, f"{type(e).__name__}: {e}")
        manifest = manifest or self.origin.fetch_manifest(digest)
        self.chunk_size = manifest.chunk_size
        for peer in self.peers:
            peer.chunk_size = manifest.chunk_size
        return manifest

    # -- file bytes ----------------------------------------------------------------------
    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        check_range(entry, offset, length)
        chunks = self._chunks(entry, offset, length) if self.chunk_size else None
        if chunks is None or not self.peers:     # not chunk-aligned: the origin, as asked
            return self._from_origin(entry, offset, length)
        per = max(1, self.segment_bytes // self.chunk_size)
        return self._in_order(entry, [chunks[k:k + per] for k in range(0, len(chunks), per)])

    def _chunks(self, entry: FileEntry, offset: int, length: int) -> list[int] | None:
        if not entry.chunks:
            return [0] if (offset, length) == (0, entry.size) else None
        first = chunk_starting_at(entry, offset, self.chunk_size)
        if first is None:
            return None
        out, end = [], offset + length
        for i in range(first, len(entry.chunks)):
            start, size = chunk_range(entry, i, self.chunk_size)
            if start >= end:
                break
            if start + size > end:
                return None
            out.append(i)
        return out

    def _in_order(self, entry: FileEntry, segments: list[list[int]]) -> Iterator[bytes]:
        """Several segments in flight at once, handed on in file order."""
        pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="peer-segment")
        pending: deque[Future] = deque()
        todo = iter(enumerate(segments))
        try:
            for k, seg in todo:
                pending.append(pool.submit(self._segment, entry, k, seg))
                if len(pending) >= self.parallel:
                    break
            while pending:
                data = pending.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(self._segment, entry, *nxt))
                yield data
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def _segment(self, entry: FileEntry, k: int, chunks: list[int]) -> bytes:
        """Segment ``k`` (consecutive ``chunks``) from the peer whose turn it is, or the next;
        each chunk checked against the manifest; from the origin when no peer can."""
        ranges = [chunk_range(entry, i, self.chunk_size) for i in chunks] if entry.chunks else [(0, entry.size)]
        expected = [entry.chunks[i] for i in chunks] if entry.chunks else [entry.sha256]
        start = ranges[0][0]
        size = ranges[-1][0] + ranges[-1][1] - start
        while True:
            busy = False
            for peer in self._usable(k):
                try:
                    data = b"".join(peer.read(entry, start, size))
                except (SourceUnavailable, IntegrityMismatch, requests.RequestException, OSError) as e:
                    if _busy(e) and not self._busy_too_long(peer):
                        busy = True
                    else:
                        self._drop(peer, f"{type(e).__name__}: {e}")
                    continue
                bad = next((i for i, (s, n), want in zip(chunks, ranges, expected)
                            if hashlib.sha256(data[s - start:s - start + n]).hexdigest() != want), None) \
                    if len(data) == size else chunks[0]
                if bad is not None:
                    self._drop(peer, f"served chunk {bad} of {entry.path} with a wrong hash", corrupt=True)
                    continue
                with self._lock:
                    self.tally.peers[peer.node] = self.tally.peers.get(peer.node, 0) + size
                    self._busy_since.pop(peer.node, None)
                return data
            if not busy:
                return b"".join(self._from_origin(entry, start, size))
            time.sleep(BUSY_POLL_SECONDS)

    def _busy_too_long(self, peer: PeerSource) -> bool:
        """Note that ``peer`` is busy; True once it has been for ``BUSY_DROP_SECONDS``."""
        with self._lock:
            since = self._busy_since.setdefault(peer.node, time.monotonic())
        return time.monotonic() - since > BUSY_DROP_SECONDS

    def _from_origin(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        for block in self.origin.read(entry, offset, length):
            with self._lock:
                self.tally.origin += len(block)
            yield block

    def _usable(self, i: int) -> list[PeerSource]:
        """The peers not dropped, starting at segment ``i``'s turn: segments spread over peers."""
        with self._lock:
            live = [p for p in self.peers if p.node not in self.tally.down]
        if not live:
            return []
        k = i % len(live)
        return live[k:] + live[:k]

    def _drop(self, peer: PeerSource, why: str, corrupt: bool = False) -> None:
        with self._lock:
            if peer.node in self.tally.down:
                return
            self.tally.down[peer.node] = why
            if corrupt:
                self.tally.corrupt.append(peer.node)
        log.warning("peer dropped for this revision", extra={"peer": peer.node, "why": why[:300],
                                                             "corrupt": corrupt})

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        self.origin.close()
