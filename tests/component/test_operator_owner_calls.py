"""The operator's gate for owner calls against real sockets on loopback: an owner that
accepts and never answers is marked unresponsive after one timeout, is then refused at
once (no second wait), a healthy owner asked in the same batch is not delayed, the
per-model bound holds, and the background probe clears the mark and wakes the model
when the owner stops hanging."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from resident_operator.owner_client import (OwnerCalls, OwnerCallsBusy, OwnerClient, OwnerUnreachable,
                                            OwnerUnresponsive, identities)
from resident_operator.settings import OperatorSettings

TIMEOUT = 0.3


class Answers(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"state": "ready"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    healthy = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=healthy.serve_forever, daemon=True).start()
    hang = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            try:
                held.append(hang.accept())   # kept open, never answered
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    yield healthy.server_address[1], hang
    healthy.shutdown()
    hang.close()


@pytest.fixture
def gate():
    """An OwnerCalls on a loop of its own thread, as on kopf's loop; pass threads call it."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    woken = []
    settings = OperatorSettings(owner_timeout_seconds=TIMEOUT, owner_recheck_seconds=0.2,
                                owner_calls_per_model=2)

    async def make():
        return OwnerCalls(settings, wake=woken.append)

    calls = asyncio.run_coroutine_threadsafe(make(), loop).result()
    yield calls, woken
    asyncio.run_coroutine_threadsafe(calls.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)


def test_a_hung_owner_costs_one_timeout_once_and_never_delays_a_healthy_one(gate, servers):
    calls, woken = gate
    healthy_port, hang = servers
    hung = OwnerClient(calls, "model", "pod-hung", "127.0.0.1", hang.getsockname()[1], "t")
    well = OwnerClient(calls, "model", "pod-well", "127.0.0.1", healthy_port, "t")
    t0 = time.monotonic()
    first = identities([hung, well])             # asked together: one wait for both
    took = time.monotonic() - t0
    assert isinstance(first[0], OwnerUnresponsive) and "no answer within 0.3s" in str(first[0])
    assert first[1] == {"state": "ready"} and TIMEOUT <= took < 2 * TIMEOUT + 0.3
    t0 = time.monotonic()
    again = identities([hung, well])               # marked: refused at once, no second wait
    assert isinstance(again[0], OwnerUnresponsive) and again[1] == {"state": "ready"}
    assert time.monotonic() - t0 < TIMEOUT / 2
    with pytest.raises(OwnerUnresponsive):
        hung.transition("abc")                      # any call to it, not only identity
    assert woken == []
    hang.close()                                    # it stops hanging (now refuses)
    deadline = time.monotonic() + 3
    while not woken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert woken == ["model"]                       # the probe heard it and woke the model
    with pytest.raises(OwnerUnreachable) as refused:
        hung.identity()
    assert not isinstance(refused.value, OwnerUnresponsive)


def test_one_model_holds_at_most_its_share_of_calls(gate, servers):
    calls, _ = gate
    _, hang = servers
    port = hang.getsockname()[1]
    owners = [OwnerClient(calls, "model", f"pod-{i}", "127.0.0.1", port, "t") for i in range(4)]
    answers = identities(owners)                    # 2 per model: two wait for a slot in vain
    assert sum(isinstance(a, OwnerUnresponsive) for a in answers) == 2
    assert sum(isinstance(a, OwnerCallsBusy) for a in answers) == 2
    other = OwnerClient(calls, "other", "pod-x", "127.0.0.1", port, "t")
    assert isinstance(identities([other])[0], OwnerUnresponsive)   # another model has its own share
