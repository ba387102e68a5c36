"""Leader election while the API server does not answer (operator/resident_operator/leadership.py):
a port that refuses every connection (an API server killed), and one that accepts and never
answers (a connection that hangs). A holder must stop before its Lease expires; a standby
must keep trying, and stay alive to its liveness probe."""

from __future__ import annotations

import socket
import threading
import time

import kubernetes
import pytest

from resident_operator.leadership import Leadership

pytestmark = pytest.mark.timeout(60)
DURATIONS = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry": 0.5}


def client(port: int) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    config.host = f"http://127.0.0.1:{port}"
    return kubernetes.client.ApiClient(config)


@pytest.fixture
def refusing_port():
    with socket.socket() as s:          # bound, never listening: every connection is refused
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def silent_port():
    """Accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("port", ["refusing_port", "silent_port"])
def test_a_holder_that_cannot_renew_stops_before_its_lease_expires(port, request):
    leadership = Leadership(client(request.getfixturevalue(port)), "resident", "resident-operator",
                            identity="op-a_1", **DURATIONS)
    lost, stop = threading.Event(), threading.Event()
    began = time.monotonic()
    thread = leadership.keep(stop, lost=lost.set)
    try:
        assert lost.wait(DURATIONS["lease_duration"] + 2), "the holder never gave up: its renew thread died or hung"
        assert time.monotonic() - began < DURATIONS["lease_duration"], "it stopped only after a standby may take over"
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.parametrize("port", ["refusing_port", "silent_port"])
def test_a_standby_keeps_trying_while_the_api_server_does_not_answer(port, request):
    leadership = Leadership(client(request.getfixturevalue(port)), "resident", "resident-operator",
                            identity="op-b_2", **DURATIONS)
    stop, outcome = threading.Event(), []
    thread = threading.Thread(target=lambda: outcome.append(leadership.acquire(stop)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 2 * DURATIONS["lease_duration"]
        while time.monotonic() < deadline:
            assert thread.is_alive(), f"acquire ended while the API server was away: {outcome}"
            assert leadership.waiting_alive(), "its liveness would fail: an attempt hangs"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(5)
    assert outcome == [False]


def test_a_holder_whose_renewal_breaks_otherwise_stops_at_once():
    """An answer the loop cannot read (not JSON) ends the holder at once, not its renew
    thread alone: a leader must never act on without anyone renewing its Lease."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Garbled(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            body = b"<html>not a Lease</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbled)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    leadership = Leadership(client(server.server_address[1]), "resident", "resident-operator",
                            identity="op-c_3", **DURATIONS)
    lost, stop = threading.Event(), threading.Event()
    began = time.monotonic()
    thread = leadership.keep(stop, lost=lost.set)
    try:
        assert lost.wait(DURATIONS["lease_duration"]), "the renew thread ended and the holder went on"
        assert time.monotonic() - began < DURATIONS["renew_deadline"]   # at once, not at the deadline
    finally:
        stop.set()
        thread.join(5)
        server.shutdown()
        server.server_close()
