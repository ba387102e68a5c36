"""Acceptance for the torch backend from the command line: ``resident bundle make-demo
--format hf`` writes a checkpoint that ``resident bundle build`` describes the same way,
``resident owner --backend torch`` serves it on 127.0.0.1, and without torch installed the
backend is a clear error."""

import json
import os
import signal
import subprocess
import time

import pytest
import requests

from bundle import cli as bundle_cli
from bundle.model_revisions import read_layout
from bundle.manifest import Role
from bundle.scan import build_manifest, read_manifest
from testkit.local_volume import stage_revision

from hf_checkpoints import PROMPT, transformers_greedy
from test_owner_cli import REPO, RESIDENT, ports_from_logs, start, stop


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hfcli")
    assert bundle_cli.main(["-q", "make-demo", str(tmp / "base"), "--format", "hf", "--size", "1MiB",
                            "--chunk-size", "64KiB"]) == 0
    for kind in ("rows", "graph"):
        assert bundle_cli.main(["-q", "make-demo", str(tmp / kind), "--from", str(tmp / "base"),
                                "--kind", kind, "--chunk-size", "64KiB"]) == 0
    return tmp


def test_make_demo_hf_is_a_checkpoint_that_bundle_build_describes_the_same(demo, tmp_path):
    made = read_manifest(demo / "base")
    roles = {f.path: f.role for f in made.files}
    assert roles == {"config.json": Role.config, "generation_config.json": Role.config,
                     "model.safetensors": Role.weights, "tokenizer.json": Role.tokenizer,
                     "tokenizer_config.json": Role.tokenizer}
    assert json.loads((demo / "base" / "config.json").read_text())["model_type"] == "llama"
    assert build_manifest(demo / "base", chunk_size=64 * 1024).digest == made.digest
    assert bundle_cli.main(["-q", "build", str(demo / "base"), "--chunk-size", "64KiB"]) == 0
    assert read_manifest(demo / "base").digest == made.digest


def test_hf_revisions_change_what_they_say(demo):
    base, rows, graph = (read_manifest(demo / k).by_path() for k in ("base", "rows", "graph"))
    assert [p for p in base if base[p].sha256 != rows[p].sha256] == ["model.safetensors"]
    assert [p for p in base if base[p].sha256 != graph[p].sha256] == ["config.json"]
    _, header = read_layout(demo / "base" / "model.safetensors")
    raw_a = (demo / "base" / "model.safetensors").read_bytes()
    raw_b = (demo / "rows" / "model.safetensors").read_bytes()
    start, _ = read_layout(demo / "rows" / "model.safetensors")
    changed = {n for n, i in header.items()
               if raw_a[start + i["data_offsets"][0]:start + i["data_offsets"][1]]
               != raw_b[start + i["data_offsets"][0]:start + i["data_offsets"][1]]}
    assert changed and all(n.endswith("_proj.weight") or n == "lm_head.weight" for n in changed)
    assert any(n.endswith("gate_proj.weight") for n in changed)


def test_resident_owner_serves_an_hf_checkpoint_with_the_torch_backend(demo, tmp_path):
    digest = stage_revision(tmp_path / "vol", demo / "base", make_current=True)
    (tmp_path / "token").write_text("s3cret\n")
    proc = start(["--backend", "torch", "--device", "cpu", "--bundle-dir", str(tmp_path / "vol"),
                  "--token-file", str(tmp_path / "token"), "--port", "0", "--warmup"], tmp_path)
    try:
        port, inference_port = ports_from_logs(proc, time.monotonic() + 120)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while requests.get(url + "/readyz", timeout=5).status_code != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "the owner never became ready"
            time.sleep(0.1)
        auth = {"Authorization": "Bearer s3cret"}
        ident = requests.get(url + "/v1/identity", headers=auth, timeout=5).json()
        assert ident["backend"] == "torch" and ident["identity"]["bundle"] == digest
        assert ident["residency"]["device"] == "cpu" and ident["residency"]["dtype"] == "bfloat16"
        assert ident["residency"]["bytesResident"] > 0
        out = requests.post(url + "/v1/generate", json={"prompt": PROMPT, "maxTokens": 12},
                            headers=auth, timeout=60).json()
        reference = transformers_greedy(demo / "base")
        assert out["tokens"] == reference
        completion = requests.post(f"http://127.0.0.1:{inference_port}/v1/completions", timeout=60,
                                   json={"model": "model", "prompt": PROMPT, "max_tokens": 12}).json()
        assert completion["choices"][0]["text"] == out["text"]
        assert completion["usage"]["completion_tokens"] == len(reference)
        streamed = requests.post(f"http://127.0.0.1:{inference_port}/v1/completions", timeout=60, stream=True,
                                 json={"model": "model", "prompt": PROMPT, "max_tokens": 12, "stream": True})
        events = [line[len(b"data: "):] for line in streamed.iter_lines() if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]" and len(events) > 3  # several pieces, not one
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == out["text"]
    finally:
        stop(proc)


def test_torch_backend_without_torch_is_a_clear_error(demo, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    blocked = ("import sys, resident_cli; sys.modules['torch'] = None; "  # as if the extra were absent
               "sys.exit(resident_cli.main())")
    proc = subprocess.run([RESIDENT[0], "-c", blocked, "owner", "--backend", "torch", "--bundle-dir",
                           str(demo / "base"), "--token-file", str(tmp_path / "token")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and "resident[torch]" in proc.stderr, proc.stderr


def test_as_pid_1_a_sigterm_while_the_backend_loads_stops_the_owner(tmp_path):
    """In a container the owner is PID 1 of its PID namespace, and PID 1 ignores a signal it
    has no handler for: a SIGTERM that came while torch was imported used to be lost, and
    kubelet waited out the Pod's grace period. Here the owner runs as PID 1 of a new PID
    namespace (util-linux unshare), gets SIGTERM once it says it is starting (torch takes
    seconds to import after that), and must exit 0 on its own."""
    (tmp_path / "token").write_text("s3cret\n")
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *RESIDENT, "owner", "--backend", "torch",
         "--device", "cpu", "--bundle-dir", str(tmp_path / "vol"), "--token-file", str(tmp_path / "token"),
         "--port", "0", "--inference-port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        children = f"/proc/{proc.pid}/task/{proc.pid}/children"
        deadline = time.monotonic() + 60
        while not open(children).read().split():
            assert time.monotonic() < deadline, "unshare never started the owner"
            time.sleep(0.01)
        owner_pid = int(open(children).read().split()[0])
        nspid = next(line for line in open(f"/proc/{owner_pid}/status") if line.startswith("NSpid:"))
        assert nspid.split()[-1] == "1", nspid       # its PID in the innermost namespace
        starting = next((line for line in proc.stderr if '"owner starting"' in line), None)
        assert starting, "the owner exited before it said it was starting"
        os.kill(owner_pid, signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "a signal came while the backend loaded" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
