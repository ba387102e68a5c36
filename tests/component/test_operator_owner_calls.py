"""The operator's gate for owner calls against real sockets on loopback: an owner that
accepts and never answers is marked unresponsive after one timeout, is then refused at
once (no second wait), a healthy owner asked in the same batch is not delayed, the
per-model bound holds, the background probe clears the mark and wakes the model when
the owner stops hanging, and probes never take a slot a pass needs. The operator stops
with calls in flight and no task failed, and a pass that runs on calls no owner. A call
reaches the owner that listens at the address now, never a predecessor that still serves
a connection it kept (real owners, real server)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kopf
import pytest

from bundle.cpu_model import make_demo, make_revision
from owner.backends.cpu import CpuBackend
from owner.runtime import Owner
from owner.server import make_server
from resident_operator import metrics
from resident_operator.owner_client import (OwnerCalls, OwnerCallsBusy, OwnerClient, OwnerUnreachable,
                                            OwnerUnresponsive, identities)
from resident_operator.settings import OperatorSettings
from testkit.local_volume import stage_revision

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
    assert metrics.REGISTRY.get_sample_value("resident_owners_unresponsive") == 1
    hang.close()                                    # it stops hanging (now refuses)
    deadline = time.monotonic() + 3
    while not woken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert woken == ["model"]                       # the probe heard it and woke the model
    assert metrics.REGISTRY.get_sample_value("resident_owners_unresponsive") == 0
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


def test_probes_of_hung_owners_never_hold_a_slot_a_pass_needs(servers):
    """Twice as many hung owners as the operator has call slots, all marked and probed
    every 0.05 s: a pass still gets a slot at once for its healthy owner, every time."""
    healthy_port, hang = servers
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def make():
        return OwnerCalls(OperatorSettings(owner_timeout_seconds=TIMEOUT, owner_recheck_seconds=0.05,
                                           owner_calls=2, owner_calls_per_model=2))

    calls = asyncio.run_coroutine_threadsafe(make(), loop).result()
    try:
        port = hang.getsockname()[1]
        for batch in range(2):   # as many at once as there are slots
            hung = [OwnerClient(calls, f"hung-{batch}", f"pod-{batch}-{i}", "127.0.0.1", port, "t")
                    for i in range(2)]
            assert all(isinstance(a, OwnerUnresponsive) for a in identities(hung))
        assert len(calls.unresponsive) == 4
        well = OwnerClient(calls, "other", "pod-well", "127.0.0.1", healthy_port, "t")
        deadline = time.monotonic() + 3 * TIMEOUT
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            assert well.identity() == {"state": "ready"}
            assert time.monotonic() - t0 < TIMEOUT / 2
    finally:
        asyncio.run_coroutine_threadsafe(calls.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)


def test_the_operator_stops_with_owner_calls_in_flight_and_no_task_failed(servers):
    """As the operator stops, its cleanup closes the gate, then kopf waits for every task on
    its loop and re-raises any that failed (the operator's exit fails), and the loop stops
    and closes while pass threads may still run. A call in flight when the gate closes ends
    no task in an error, and a pass that asks after the close, or after the loop closed,
    gets kopf.TemporaryError: it ends and writes nothing derived from owners it could not
    ask (not a RuntimeError it would report on the model as ReconcileFailed)."""
    healthy_port, hang = servers
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def make():
        return OwnerCalls(OperatorSettings(owner_timeout_seconds=TIMEOUT))

    calls = asyncio.run_coroutine_threadsafe(make(), loop).result()
    hung = OwnerClient(calls, "model", "pod-hung", "127.0.0.1", hang.getsockname()[1], "t")
    well = OwnerClient(calls, "model", "pod-well", "127.0.0.1", healthy_port, "t")
    assert well.identity() == {"state": "ready"}
    in_flight = []

    def a_pass():
        try:
            in_flight.append(identities([hung, well]))
        except kopf.TemporaryError as e:
            in_flight.append(e)
    passing = threading.Thread(target=a_pass)
    passing.start()
    time.sleep(TIMEOUT / 3)   # its call to the hung owner waits for an answer

    async def stop_as_kopf_does():
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        await calls.close()
        done, _ = await asyncio.wait(tasks, timeout=5)
        return [t for t in done if not t.cancelled() and t.exception() is not None]

    failed = asyncio.run_coroutine_threadsafe(stop_as_kopf_does(), loop).result()
    passing.join(5)
    assert failed == [] and isinstance(in_flight[0], kopf.TemporaryError)
    with pytest.raises(kopf.TemporaryError):
        well.identity()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
    with pytest.raises(kopf.TemporaryError):
        well.identity()
    with pytest.raises(kopf.TemporaryError):
        calls.retain("model", set())


def serve_owner(volume, bundle, port):
    """A real owner of ``bundle`` and its control server on 127.0.0.1:``port`` (HTTP/1.1,
    connections kept alive as a client asks)."""
    stage_revision(volume, bundle, make_current=True, hardlink=False)
    owner = Owner(volume, CpuBackend())
    server = make_server(owner, "t", "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    owner.start()
    return owner, server


def test_a_call_reaches_the_owner_at_the_address_now_not_its_predecessor(gate, tmp_path):
    """A successor Pod at its predecessor's host and port (RESIDENT_OWNER_HOST, hostNetwork,
    a reused Pod IP) while the old owner, stopped listening, still answers on connections it
    holds (a terminating owner closing its model; the played kubelet)."""
    calls, _ = gate
    base = make_demo(tmp_path / "base", 64 * 1024, seed=1).digest
    rows = make_revision(tmp_path / "base", tmp_path / "rows", "rows", seed=2).digest
    old, old_server = serve_owner(tmp_path / "old", tmp_path / "base", 0)
    port = old_server.server_address[1]
    new = new_server = None
    try:
        first = OwnerClient(calls, "model", "pod-0", "127.0.0.1", port, "t")
        assert first.identity()["identity"]["bundle"] == base
        old_server.shutdown()                      # its Pod is deleted: it stops listening
        old_server.server_close()
        new, new_server = serve_owner(tmp_path / "new", tmp_path / "rows", port)
        successor = OwnerClient(calls, "model", "pod-0-r1", "127.0.0.1", port, "t")
        for _ in range(3):
            assert successor.identity()["identity"]["bundle"] == rows
    finally:
        for server in (old_server, new_server):
            if server is not None:
                server.shutdown()
                server.server_close()
        for owner in (old, new):
            if owner is not None:
                owner.close()
