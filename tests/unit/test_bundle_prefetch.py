"""A fetch reads its source on a thread of its own, ahead of the hashing
(bundle.materialize.prefetched): the blocks keep their order, an error comes after the
blocks read before it, and a fetch that stops early stops and closes the source."""

from __future__ import annotations

import threading
import time

import pytest

from bundle.errors import SourceUnavailable
from bundle.materialize import prefetched

pytestmark = pytest.mark.unit


class Source:
    """A source's read: numbered blocks, recording when each was read and whether it closed."""

    def __init__(self, blocks: int, fail_after: int | None = None) -> None:
        self.blocks, self.fail_after = blocks, fail_after
        self.read_at: list[float] = []
        self.closed = threading.Event()

    def __iter__(self):
        try:
            for i in range(self.blocks):
                if i == self.fail_after:
                    raise SourceUnavailable("the server went away")
                self.read_at.append(time.monotonic())
                yield bytes([i]) * 4
        finally:
            self.closed.set()


def test_blocks_keep_their_order_and_are_read_ahead_of_a_slow_caller():
    source = Source(4)
    got, used_at = [], []
    for block in prefetched(iter(source), depth=4):
        got.append(block)
        used_at.append(time.monotonic())
        time.sleep(0.1)                      # hashing and writing one block
    assert got == [bytes([i]) * 4 for i in range(4)]
    assert source.read_at[-1] < used_at[1]   # all read before the caller took the second
    assert source.closed.is_set()


def test_an_error_of_the_source_comes_after_the_blocks_read_before_it():
    got = []
    with pytest.raises(SourceUnavailable, match="went away"):
        for block in prefetched(iter(Source(5, fail_after=2))):
            got.append(block)
    assert got == [bytes([0]) * 4, bytes([1]) * 4]


def test_a_caller_that_stops_early_stops_the_reader_and_closes_the_source():
    source = Source(1000)
    stream = prefetched(iter(source), depth=2)
    assert next(stream) == bytes([0]) * 4
    stream.close()                           # e.g. a chunk's digest did not match
    assert source.closed.wait(2)
    assert len(source.read_at) <= 4          # no more than the queue and the one in hand
    assert not [t for t in threading.enumerate() if t.name == "fetch-reader"]
