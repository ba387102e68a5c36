"""Acceptance: ``resident owner`` serves a generated demo bundle and answers /v1/generate
on its control port and /v1/completions on its inference port, on 127.0.0.1; a start
failure exits non-zero with the cause."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from bundle.cpu_model import make_demo
from testkit.local_volume import stage_revision
from testkit.thread_signals import other_threads, signal_thread

REPO = Path(__file__).resolve().parents[2]
RESIDENT = [sys.executable, "-c", "import sys, resident_cli; sys.exit(resident_cli.main())"]


def start(args, cwd):
    args = [*args, "--inference-port", "0"] if "--inference-port" not in args else args
    return subprocess.Popen(RESIDENT + ["owner", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def ports_from_logs(proc, deadline):
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("msg") == "owner listening":
            return doc["port"], doc["inference_port"]
    raise AssertionError("the owner never logged its port")


def serving_ports(proc):
    """(control port, inference port) of a started owner, once its /readyz answers 200."""
    port, inference_port = ports_from_logs(proc, time.monotonic() + 30)
    deadline = time.monotonic() + 30
    while requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return port, inference_port


@pytest.fixture
def volume(tmp_path):
    make_demo(tmp_path / "demo", 256 * 1024, seed=1)
    digest = stage_revision(tmp_path / "vol", tmp_path / "demo", make_current=True)
    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "key").write_text("app-key\n")
    return tmp_path, digest


def test_resident_owner_serves_a_demo_bundle(volume):
    tmp, digest = volume
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"),
                  "--port", "0", "--warmup", "--model-name", "demo", "--api-key-file", str(tmp / "key")], tmp)
    try:
        port, inference_port = serving_ports(proc)
        url = f"http://127.0.0.1:{port}"
        r = requests.post(url + "/v1/generate", json={"prompt": "hello", "maxTokens": 4},
                          headers={"Authorization": "Bearer s3cret"}, timeout=10)
        assert r.status_code == 200
        body = r.json()
        assert len(body["tokens"]) == 4 and body["identity"]["bundle"] == digest
        assert body["firstTokenSeconds"] > 0
        ident = requests.get(url + "/v1/identity", headers={"Authorization": "Bearer s3cret"}, timeout=10).json()
        assert ident["residency"]["device"] == "cpu" and ident["residency"]["dtype"] == "float32"
        assert ident["residency"]["bytesResident"] > 256 * 1024  # about 256 KiB of BF16 weights, widened
        r = requests.post(f"http://127.0.0.1:{inference_port}/v1/completions", timeout=10,
                          json={"model": "demo", "prompt": "hello", "max_tokens": 4},
                          headers={"Authorization": "Bearer app-key"})
        assert r.status_code == 200 and r.json()["model"] == "demo"
        assert r.headers["Resident-Revision"] == r.json()["system_fingerprint"] == digest
        r = requests.post(f"http://127.0.0.1:{inference_port}/v1/completions", timeout=10,
                          json={"model": "demo", "prompt": "hello"})
        assert r.status_code == 401
    finally:
        stop(proc)
    assert proc.returncode == 0


def test_start_failure_exits_non_zero_with_the_cause(volume):
    tmp, digest = volume
    weights = tmp / "vol" / "current" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    os.unlink(weights)  # the volume hardlinks the demo; break the link before corrupting
    data[1000] ^= 0xFF
    weights.write_bytes(bytes(data))
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--port", "0"], tmp)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 1
    assert "start failed" in err and "sha256 does not match" in err


def test_missing_token_file_is_a_clear_error(volume):
    tmp, _ = volume
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "nope")], tmp)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "nope" in err


def test_vendor_backend_without_its_sdk_exits_with_a_clear_error(volume):
    """As in a Pod: kubelet's termination-log file exists (empty) and gets one line."""
    tmp, _ = volume
    log = tmp / "termination-log"
    log.write_text("")
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--backend", "rngd",
                  "--termination-log", str(log)], tmp)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "furiosa_llm" in err and "furiosa-llm" in err
    line = log.read_text()
    assert line.startswith("BackendUnavailable: the rngd backend needs the Python module 'furiosa_llm'")
    assert line.count("\n") == 1 and "furiosa-llm" in line
    logged = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert any(d["msg"] == "owner cannot start" and d["reason"] == "BackendUnavailable" for d in logged)


def test_a_load_failure_is_recorded_and_no_termination_log_is_made_outside_kubernetes(volume):
    tmp, _ = volume
    (tmp / "vol" / "current").unlink()            # nothing to load
    log = tmp / "termination-log"
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--port", "0",
                  "--termination-log", str(log)], tmp)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "LoadFailed" in err
    assert not log.exists()                       # absent, as outside Kubernetes: not created
    log.write_text("")
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--port", "0",
                  "--termination-log", str(log)], tmp)
    proc.communicate(timeout=60)
    assert proc.returncode == 1 and log.read_text().startswith("LoadFailed: ")


def test_help_explains_the_command():
    out = subprocess.run(RESIDENT + ["owner", "--help"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0
    assert "--bundle-dir" in out.stdout and "--token-file" in out.stdout and "current ->" in out.stdout
    assert "--inference-port" in out.stdout and "inference port is open" in out.stdout


def test_sigterm_answers_until_requests_stop_coming_then_exits(volume):
    tmp, digest = volume
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--port", "0",
                  "--model-name", "demo", "--shutdown-quiet-seconds", "0.5"], tmp)
    try:
        port, inference_port = serving_ports(proc)
        url = f"http://127.0.0.1:{inference_port}/v1/completions"
        ask = lambda: requests.post(url, json={"model": "demo", "prompt": "hi", "max_tokens": 2}, timeout=10)  # noqa: E731
        assert ask().status_code == 200
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        answered = []
        while time.monotonic() - t0 < 1.5:   # a client a proxy still sends here, every 0.1 s
            answered.append(ask().status_code)
            time.sleep(0.1)
        assert answered and set(answered) == {200} and proc.poll() is None
        assert requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 503
        t_last = time.monotonic()            # the traffic stops: it goes once quiet for 0.5 s
        assert proc.wait(10) == 0
        assert 0.4 <= time.monotonic() - t_last < 5
    finally:
        stop(proc)


def test_sigterm_delivered_to_a_server_thread_still_stops_the_owner(volume):
    """The kernel delivers a process's SIGTERM to any thread that does not block it; CPython
    runs the handler in the main thread only. An untimed wait there never woke."""
    tmp, _ = volume
    proc = start(["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--port", "0",
                  "--model-name", "demo", "--shutdown-quiet-seconds", "0.2"], tmp)
    try:
        serving_ports(proc)
        threads = other_threads(proc.pid)
        assert threads, "the owner serves on threads of its own"
        signal_thread(proc.pid, threads[0], signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)


def settled_thread_count(pid):
    """The number of threads of ``pid`` but its main thread, once it held still for half a
    second (a server thread handling the last /readyz may still be ending)."""
    counts = []
    while len(counts) < 5 or len(set(counts[-5:])) > 1:
        counts.append(len(other_threads(pid)))
        time.sleep(0.1)
    return counts[-1]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no extra thread on one core")
def test_the_owner_computes_on_one_blas_thread_unless_the_environment_asks_for_more(volume, monkeypatch):
    """numpy's OpenBLAS starts a spinning worker per core; on a busy 2-core machine that made
    an owner spend 9 times the CPU per completion. The owner defaults it to one thread."""
    tmp, _ = volume
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    args = ["--bundle-dir", str(tmp / "vol"), "--token-file", str(tmp / "token"), "--port", "0"]
    counts = {}
    for asked in (None, "2"):
        if asked:
            monkeypatch.setenv("OPENBLAS_NUM_THREADS", asked)
        proc = start(args, tmp)
        try:
            serving_ports(proc)
            counts[asked] = settled_thread_count(proc.pid)
        finally:
            stop(proc)
    assert counts["2"] == counts[None] + 1, f"threads by OPENBLAS_NUM_THREADS: {counts}"
