"""A standby operator answers kubelet's liveness probe while it waits for the Lease.

kopf's liveness endpoint exists only once the process leads; without an answer of its
own a standby fails the chart's livenessProbe and kubelet kills it again and again."""

from __future__ import annotations

import socket

import pytest
import requests

from localcluster.processes import free_port
from resident_operator.leadership import Leadership, standby_liveness

pytestmark = pytest.mark.unit


def test_a_waiting_standby_answers_its_liveness_path_and_frees_the_port_for_kopf():
    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    alive = {"value": True}
    with standby_liveness(url, lambda: alive["value"]):
        assert requests.get(url, timeout=5).status_code == 200
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 503
        alive["value"] = False                      # the acquire loop stopped trying
        assert requests.get(url, timeout=5).status_code == 503
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)
    with socket.socket() as s:                      # kopf binds the same port next
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_no_liveness_url_serves_nothing():
    with standby_liveness(None, lambda: True):
        pass


def test_the_waiting_loop_is_alive_while_it_tried_within_three_retries():
    now = {"t": 100.0}
    lead = Leadership.__new__(Leadership)
    lead.clock, lead.retry, lead.tried_at = (lambda: now["t"]), 2.0, 100.0
    assert lead.waiting_alive()
    now["t"] = 105.9
    assert lead.waiting_alive()
    now["t"] = 106.1
    assert not lead.waiting_alive()
