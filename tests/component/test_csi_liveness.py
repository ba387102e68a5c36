"""The bridge's /healthz, as kubelet's liveness probe calls it: a real bridge process on a
unix socket, a real HTTP request, and behind it a real CSI Probe over that socket.

Healthy, it answers 200; when Probe reports the store unusable, 500 with the reason, and
200 again once the store is back; a frozen process (SIGSTOP) answers nothing within a
1 s probe timeout, and answers again after SIGCONT."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from csi_bridge.liveness import LivenessCheck
from localcluster.processes import free_port
from testkit.bridge import BridgeProcess

KUBELET_TIMEOUT = 1.0  # the probe timeout these tests give kubelet's part


def healthz(port: int, timeout: float = KUBELET_TIMEOUT) -> tuple[int, str]:
    """GET /healthz as kubelet does: the status code and body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_healthz(port: int, status: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = healthz(port)
            if last[0] == status:
                return last[1]
        except OSError as e:
            last = e
        time.sleep(0.1)
    pytest.fail(f"/healthz did not answer {status} in {timeout}s; last: {last!r}")


@pytest.fixture
def bridge():
    root = Path(tempfile.mkdtemp(prefix="live-", dir="/tmp"))  # unix socket paths are short
    port = free_port()
    process = BridgeProcess(root / "b", extra_args=("--healthz-port", str(port)))
    process.healthz_port = port
    process.start()
    try:
        yield process
    finally:
        if process.proc is not None:
            os.kill(process.proc.pid, signal.SIGCONT)  # never leave a stopped process behind
        process.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_healthy_bridge_answers_200_on_loopback_only(bridge):
    assert healthz(bridge.healthz_port) == (200, "ok\n")
    listening = [line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]
                 if line.split()[3] == "0A"]
    assert [a for a in listening if a.endswith(f":{bridge.healthz_port:04X}")] == [
        f"0100007F:{bridge.healthz_port:04X}"]


def test_not_ready_probe_answers_500_with_the_reason_until_the_store_is_back(bridge):
    blobs = bridge.root / "data" / "store" / "blobs"
    assert healthz(bridge.healthz_port)[0] == 200
    blobs.rename(blobs.with_name("blobs.away"))
    status, body = healthz(bridge.healthz_port)
    assert status == 500
    assert "not ready" in body and "missing its blobs/ or revisions/ directory" in body
    # every request asks again: nothing is cached
    blobs.with_name("blobs.away").rename(blobs)
    assert healthz(bridge.healthz_port) == (200, "ok\n")


def test_frozen_bridge_fails_a_1s_probe_and_recovers_when_thawed(bridge):
    assert healthz(bridge.healthz_port)[0] == 200
    os.kill(bridge.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(OSError):   # the kernel accepts the connection; nobody answers
            healthz(bridge.healthz_port)
        assert time.monotonic() - started < KUBELET_TIMEOUT + 1.0
        # a probe from outside the process (as the livenessprobe sidecar's) misses its
        # deadline on the CSI socket itself
        check = LivenessCheck(bridge.socket, timeout=1.0)
        try:
            problem = check.problem()
        finally:
            check.close()
        assert problem is not None and "DEADLINE_EXCEEDED" in problem
    finally:
        os.kill(bridge.proc.pid, signal.SIGCONT)
    assert wait_healthz(bridge.healthz_port, 200) == "ok\n"


def test_a_stopped_plugin_is_reported_unavailable(bridge):
    check = LivenessCheck(bridge.socket)
    try:
        assert check.problem() is None
        bridge.kill()
        problem = check.problem()
    finally:
        check.close()
    assert problem is not None and "UNAVAILABLE" in problem


def test_healthz_and_metrics_on_one_port_share_a_listener():
    root = Path(tempfile.mkdtemp(prefix="live-", dir="/tmp"))
    port = free_port()
    process = BridgeProcess(root / "b", extra_args=("--healthz-port", str(port)))
    process.args[process.args.index("--metrics-port") + 1] = str(port)
    try:
        process.start()
        assert healthz(port) == (200, "ok\n")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "resident_csi_requests_total" in text
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
        assert e.value.code == 404
    finally:
        process.stop()
        shutil.rmtree(root, ignore_errors=True)
