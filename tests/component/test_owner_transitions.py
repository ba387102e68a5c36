"""Transitions through a real owner HTTP server on 127.0.0.1: strategies, timings, faults,
quarantine, unload and concurrent inference.

The Fault*/Slow* backends are test-only subclasses of the real cpu backend that inject
one failure each (FaultyWriteCpuBackend lives in tests/fault_backends.py).
"""

import json
import os
import shutil
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
import requests

from bundle.cpu_model import make_demo, make_revision
from bundle.scan import build_manifest, write_manifest
from owner.backends.base import first_token
from owner.backends.cpu import CpuBackend
from testkit.local_volume import stage_revision
from owner.revisions import open_revision
from owner.runtime import Owner
from owner.server import make_server

from fault_backends import FaultyWriteCpuBackend

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SIZE = 512 * 1024
PROMPT = "In place or reload?"


class FaultyRestoreCpuBackend(FaultyWriteCpuBackend):
    """Test-only: corrupts the write (as above) and then fails every restoring write."""

    def write_rows(self, name, rows, values):
        if self.writes >= self.patches:
            self.writes += 1
            raise OSError("injected: device refused the restoring write")
        super().write_rows(name, rows, values)


class FaultyStrayWriteCpuBackend(CpuBackend):
    """Test-only: with chunk verification on, the first write also flips a bit in a
    neighbouring row that is not part of the update (inside a chunk the update touches)."""

    def apply_in_place(self, update):
        self.update, self.strays = update, 0
        return super().apply_in_place(update)

    def write_rows(self, name, rows, values):
        super().write_rows(name, rows, values)
        if self.strays:
            return
        self.strays += 1
        slot = self.layouts()["model.safetensors"].by_name()[name]
        for row in (int(rows.min()) - 1, int(rows.max()) + 1):
            a = slot.start + row * slot.row_bytes
            inside = any(c.offset <= a and a + slot.row_bytes <= c.offset + c.length for c in self.update.checks)
            if 0 <= row < slot.rows and row not in set(rows.tolist()) and inside:
                self.weights[name][row, 0] = -self.weights[name][row, 0] or 1.0
                return
        raise AssertionError("no neighbouring row inside a changed chunk")


class FaultyReleaseCpuBackend(CpuBackend):
    """Test-only: the update applies and verifies, but releasing staged memory fails."""

    def release_staged(self, update):
        raise RuntimeError("injected: staged buffer still pinned")


class SlowApplyCpuBackend(CpuBackend):
    """Test-only: each in-place row write takes 0.1 s, so requests pile up on the lock."""

    def __init__(self):
        super().__init__()
        self.writing = threading.Event()

    def write_rows(self, name, rows, values):
        self.writing.set()
        time.sleep(0.1)
        super().write_rows(name, rows, values)


class CountingCpuBackend(CpuBackend):
    """Test-only: records which variants generate ran on."""

    def __init__(self):
        super().__init__()
        self.ran = []

    def _generate(self, tokens, max_tokens, variant):   # under generate and first_token
        self.ran.append(variant)
        return super()._generate(tokens, max_tokens, variant)


@pytest.fixture(scope="module")
def volume(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("owner")
    src, vol = tmp / "src", tmp / "vol"
    digests = {"base": make_demo(src / "base", SIZE, seed=5, chunk_size=64 * 1024).digest}
    stage_revision(vol, src / "base", make_current=True, hardlink=False)
    make_revision(src / "base", src / "rows", "rows", seed=8, fraction=0.05, chunk_size=64 * 1024)
    make_revision(src / "base", src / "rows2", "rows", seed=9, fraction=0.2, chunk_size=64 * 1024,
                  tensors=["lm_head.weight", "layers.0.attn.v_proj.weight"])
    make_revision(src / "base", src / "graph", "graph", chunk_size=64 * 1024)
    make_revision(src / "base", src / "whole", "whole", chunk_size=64 * 1024)
    for name in ("rows", "rows2", "graph", "whole"):
        digests[name] = stage_revision(vol, src / name, hardlink=False)
    return vol, digests


@pytest.fixture(scope="module")
def reference(volume):
    """Tokens a fresh load of each revision generates for PROMPT."""
    vol, digests = volume
    out = {}
    for name, digest in digests.items():
        b = CpuBackend()
        b.load(open_revision(vol, digest))
        out[digest] = b.generate(PROMPT, 8).tokens
    return out


class Client:
    def __init__(self, url, owner):
        self.url, self.owner = url, owner

    def get(self, path, auth=True):
        return requests.get(self.url + path, headers=AUTH if auth else {}, timeout=30)

    def post(self, path, body, headers=AUTH):
        return requests.post(self.url + path, json=body, headers=headers, timeout=30)

    def transition(self, target, strategy="Auto", path="WholeBundle"):
        r = self.post("/v1/transitions", {"target": target, "path": path, "strategy": strategy})
        assert r.status_code == 202, r.text
        tid = r.json()["id"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = self.get(f"/v1/transitions/{tid}").json()
            if st["result"] != "running":
                return st
            time.sleep(0.01)
        raise AssertionError(f"transition {tid} did not finish")

    def generate(self, prompt=PROMPT, max_tokens=8):
        return self.post("/v1/generate", {"prompt": prompt, "maxTokens": max_tokens})


@contextmanager
def serving(vol, backend=None, warmup=False):
    owner = Owner(vol, backend or CpuBackend(), warmup=warmup)
    owner.start()
    server = make_server(owner, TOKEN, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Client(f"http://127.0.0.1:{server.server_address[1]}", owner)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        owner.close()


def identity_of(vol, digest):
    return open_revision(vol, digest).manifest.identity()


def test_in_place_transition_succeeds_with_timings_metrics_and_parity(volume, reference):
    vol, d = volume
    with serving(vol) as c:
        st = c.transition(d["rows"])
        assert (st["result"], st["strategy"], st["from"], st["to"]) == ("succeeded", "InPlace", d["base"], d["rows"])
        assert st["rowsChanged"] > 0 and st["identity"] == identity_of(vol, d["rows"])
        assert st["timings"].pop("warmupSeconds") is None  # only cold reloads warm up
        assert all(v is not None and v >= 0 for v in st["timings"].values())
        assert c.get("/v1/identity").json()["identity"] == identity_of(vol, d["rows"])
        g = c.generate().json()
        assert g["tokens"] == reference[d["rows"]] and g["identity"]["bundle"] == d["rows"]
        metrics = c.get("/metrics", auth=False).text
        assert 'resident_owner_transition_duration_seconds_count{phase="apply",strategy="InPlace"} 1.0' in metrics
        assert 'resident_owner_transitions_total{result="succeeded",strategy="InPlace"} 1.0' in metrics
        assert 'resident_owner_state{state="ready"} 1.0' in metrics


def test_in_place_applies_a_bundle_cut_at_its_tensors_and_checks_its_chunks(tmp_path, volume, reference):
    """The same revisions with chunks cut at tensors (``--chunking tensors``): the owner finds
    the changed chunks by their offsets, patches the rows, and its chunk check passes."""
    old_vol, d = volume
    vol, cut = tmp_path / "vol", {}
    for name in ("base", "rows"):
        src = tmp_path / name
        shutil.copytree(open_revision(old_vol, d[name]).dir, src)
        manifest = build_manifest(src, chunk_size=64 * 1024, chunking="tensors")
        assert any(f.offsets for f in manifest.files)
        write_manifest(src, manifest)
        cut[name] = stage_revision(vol, src, make_current=name == "base", hardlink=False)
    assert cut["rows"] != d["rows"]
    with serving(vol, CpuBackend(verify_chunks=True)) as c:
        st = c.transition(cut["rows"])
        assert (st["result"], st["strategy"]) == ("succeeded", "InPlace"), st
        assert 0 < st["rowsChanged"]
        assert c.generate().json()["tokens"] == reference[d["rows"]]


def test_auto_reloads_when_not_admissible_and_reuses_graph_only_when_unchanged(volume, reference):
    vol, d = volume
    with serving(vol) as c:
        st = c.transition(d["graph"], path="GraphOnly")
        assert (st["result"], st["strategy"], st["graphReused"], st["weightsReused"]) == (
            "succeeded", "Reload", False, True)
        assert "reload chosen" in st["reason"]
        st = c.transition(d["whole"])
        assert (st["result"], st["strategy"], st["graphReused"], st["weightsReused"]) == (
            "succeeded", "Reload", False, False)
        st = c.transition(d["rows"], strategy="Reload")
        assert (st["result"], st["strategy"], st["graphReused"], st["weightsReused"]) == (
            "succeeded", "Reload", True, False)
        assert st["timings"].pop("warmupSeconds") is None  # the owner does not warm up
        assert all(v is not None for v in st["timings"].values())
        assert c.generate().json()["tokens"] == reference[d["rows"]]
        metrics = c.get("/metrics", auth=False).text
        assert 'resident_owner_transitions_total{result="succeeded",strategy="Reload"} 3.0' in metrics
        assert 'resident_owner_transition_duration_seconds_count{phase="first_token",strategy="Reload"} 3.0' in metrics


def test_in_place_strategy_answers_needs_reload_and_changes_nothing(volume, reference):
    vol, d = volume
    with serving(vol) as c:
        for target in ("graph", "whole"):
            st = c.transition(d[target], strategy="InPlace")
            assert st["result"] == "needs-reload" and st["identity"]["bundle"] == d["base"]
        assert c.get("/readyz", auth=False).status_code == 200
        assert c.generate().json()["tokens"] == reference[d["base"]]


def test_corrupt_write_is_rejected_and_base_is_restored(volume, reference):
    vol, d = volume
    with serving(vol, FaultyWriteCpuBackend()) as c:
        st = c.transition(d["rows2"])
        assert st["result"] == "failed" and "verification failed" in st["reason"]
        assert st["identity"] == identity_of(vol, d["base"])
        assert c.get("/v1/identity").json()["state"] == "ready"
        assert c.generate().json()["tokens"] == reference[d["base"]]
        metrics = c.get("/metrics", auth=False).text
        assert 'resident_owner_transitions_total{result="failed",strategy="InPlace"} 1.0' in metrics
        live = c.owner.backend
        fresh = CpuBackend()
        fresh.load(open_revision(vol, d["base"]))
        assert all(np.array_equal(live.weights[n].view(np.uint32), fresh.weights[n].view(np.uint32))
                   for n in fresh.weights)


def test_restore_failure_unloads_and_refuses_inference(volume):
    vol, d = volume
    with serving(vol, FaultyRestoreCpuBackend()) as c:
        st = c.transition(d["rows2"])
        assert st["result"] == "failed" and "unloaded" in st["reason"]
        body = c.get("/v1/identity").json()
        assert body["state"] == "unloaded" and body["identity"] is None
        r = c.generate()
        assert r.status_code == 503 and "unloaded" in r.json()["error"]
        assert c.get("/readyz", auth=False).status_code == 503
        assert c.post("/v1/transitions", {"target": d["base"], "path": "WholeBundle"}).status_code == 409


def test_chunk_verification_catches_a_stray_write_and_unloads_when_restore_cannot_fix_it(volume):
    vol, d = volume
    with serving(vol, FaultyStrayWriteCpuBackend(verify_chunks=True)) as c:
        st = c.transition(d["rows2"])
        assert st["result"] == "failed" and "unloaded" in st["reason"]
        assert "rebuilt from live weights do not match" in st["reason"]
        assert c.get("/v1/identity").json()["state"] == "unloaded"
        assert c.generate().status_code == 503


def test_chunk_verification_passes_a_clean_update(volume, reference):
    vol, d = volume
    with serving(vol, CpuBackend(verify_chunks=True)) as c:
        for target in ("rows", "rows2", "base"):
            st = c.transition(d[target])
            assert st["result"] == "succeeded" and st["strategy"] == "InPlace"
            assert c.generate().json()["tokens"] == reference[d[target]]


def test_release_failure_quarantines_and_blocks_transitions(volume, reference):
    vol, d = volume
    with serving(vol, FaultyReleaseCpuBackend()) as c:
        st = c.transition(d["rows"])
        assert st["result"] == "failed" and "quarantined" in st["reason"]
        assert c.get("/v1/identity").json()["state"] == "quarantined"
        r = c.post("/v1/transitions", {"target": d["base"], "path": "WholeBundle", "strategy": "Reload"})
        assert r.status_code == 409 and "quarantined" in r.json()["error"]
        assert c.get("/readyz", auth=False).status_code == 503
        g = c.generate().json()  # the verified weights keep serving until the operator replaces us
        assert g["tokens"] == reference[g["identity"]["bundle"]]


def test_corrupt_target_chunk_fails_the_transition_and_keeps_base(tmp_path, volume, reference):
    vol, d = volume
    import shutil
    copy = tmp_path / "vol"
    shutil.copytree(vol, copy, symlinks=True)
    rev, base = open_revision(copy, d["rows"]), open_revision(copy, d["base"])
    new, old = rev.manifest.by_path()["model.safetensors"], base.manifest.by_path()["model.safetensors"]
    changed = [i for i, (a, b) in enumerate(zip(old.chunks, new.chunks)) if a != b]
    weights = rev.dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[changed[0] * rev.manifest.chunk_size + 100] ^= 0xFF  # inside a chunk the update must read
    weights.write_bytes(bytes(data))
    with serving(copy) as c:
        st = c.transition(d["rows"])
        assert st["result"] == "failed" and "do not match" in st["reason"]
        assert c.get("/v1/identity").json()["identity"]["bundle"] == d["base"]
        assert c.generate().json()["tokens"] == reference[d["base"]]


def test_concurrent_generate_waits_and_sees_old_or_new_never_a_mix(volume, reference):
    vol, d = volume
    backend = SlowApplyCpuBackend()
    with serving(vol, backend) as c:
        results, errors = [], []

        def client(after_write_started):
            if after_write_started:
                backend.writing.wait(10)
            t0 = time.monotonic()
            r = c.generate()
            (results if r.status_code == 200 else errors).append((after_write_started, r.json(),
                                                                  time.monotonic() - t0))

        r = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle"})
        assert r.status_code == 202
        second = c.post("/v1/transitions", {"target": d["rows2"], "path": "WholeBundle"})
        assert second.status_code == 409 and "already running" in second.json()["error"]
        threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert len(results) == 6
        for after, body, _ in results:
            assert body["tokens"] == reference[body["identity"]["bundle"]]  # tokens match the identity
            if after:  # started while rows were being written: waited for the lock, saw the new model
                assert body["identity"]["bundle"] == d["rows"]
        c.owner.wait_idle()
        assert c.owner.transitions[r.json()["id"]].result == "succeeded"


def test_bad_requests_get_clear_4xx(tmp_path, volume):
    vol, d = volume
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    fake = "sha256:" + "ab" * 32
    link = vol / "revisions" / fake.replace(":", "-")
    os.symlink(outside, link)
    try:
        with serving(vol) as c:
            body = {"target": d["rows"], "path": "WholeBundle"}
            assert c.get("/v1/identity", auth=False).status_code == 401
            bad = {"Authorization": "Bearer wrong"}
            assert requests.get(c.url + "/v1/identity", headers=bad, timeout=5).status_code == 401
            assert c.post("/v1/transitions", body, headers=bad).status_code == 401
            assert c.post("/v1/generate", {"prompt": "x"}, headers=bad).status_code == 401
            r = c.post("/v1/transitions", {"target": "sha256:" + "0" * 64, "path": "WholeBundle"})
            assert r.status_code == 404 and "not staged" in r.json()["error"]
            r = c.post("/v1/transitions", {"target": fake, "path": "WholeBundle"})
            assert r.status_code == 400 and "outside" in r.json()["error"]
            r = c.post("/v1/transitions", {"target": d["rows"], "path": "../../etc"})
            assert r.status_code == 400 and "path" in r.json()["error"]
            r = c.post("/v1/transitions", {"target": "sha256:../../x", "path": "WholeBundle"})
            assert r.status_code == 400 and "target" in r.json()["error"]
            r = c.post("/v1/transitions", {"target": d["whole"], "path": "GraphOnly"})
            assert r.status_code == 400 and "weights differ" in r.json()["error"]
            r = requests.post(c.url + "/v1/generate", data=b"{not json", headers=AUTH, timeout=5)
            assert r.status_code == 400
            assert c.generate(max_tokens=5000).status_code == 400
            r = c.generate(prompt="x " * 1000, max_tokens=100)  # 1000 words: more tokens than any variant holds
            assert r.status_code == 400 and "exceed" in r.json()["error"]
            assert c.get("/v1/transitions/abc").status_code == 404
            assert c.get("/v1/transitions/abc?waitSeconds=1").status_code == 404
            r = c.get("/v1/transitions/abc?waitSeconds=soon")
            assert r.status_code == 400 and "waitSeconds" in r.json()["error"]
            assert c.get("/v1/transitions/abc?waitSeconds=61").status_code == 400
            assert c.get("/v1/transitions/abc?waitSeconds=-1").status_code == 400
            assert c.get("/v1/nothing").status_code == 404
            assert c.get("/v1/identity").json()["identity"]["bundle"] == d["base"]  # nothing changed
            assert not c.owner.transitions
    finally:
        os.unlink(link)


def test_a_waiting_get_answers_when_the_result_is_set_with_identity_and_state_final(volume, reference):
    """?waitSeconds blocks while the transition runs and answers at its end, not later:
    the answer already carries the new identity, and /v1/identity already says ready."""
    vol, d = volume
    with serving(vol, SlowApplyCpuBackend()) as c:
        r = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle", "strategy": "InPlace"})
        tid = r.json()["id"]
        short = c.get(f"/v1/transitions/{tid}?waitSeconds=0.05").json()
        assert short["result"] == "running"          # the wait times out while it runs
        t0 = time.monotonic()
        st = c.get(f"/v1/transitions/{tid}?waitSeconds=30").json()
        waited = time.monotonic() - t0
        assert st["result"] == "succeeded" and st["identity"] == identity_of(vol, d["rows"])
        assert waited < 10                             # answered at the end, not after 30 s
        ident = c.get("/v1/identity").json()
        assert (ident["state"], ident["identity"]) == ("ready", identity_of(vol, d["rows"]))
        again = c.get(f"/v1/transitions/{tid}?waitSeconds=30")  # finished: answers at once
        assert again.json()["result"] == "succeeded" and again.elapsed.total_seconds() < 1
        c.transition(d["base"], strategy="InPlace")   # leave the shared volume's owner on base


def test_revision_whose_manifest_does_not_hash_to_its_name_is_refused(tmp_path, volume):
    import shutil

    vol, d = volume
    impostor = "sha256:" + "cd" * 32
    shutil.copytree(open_revision(vol, d["rows"]).dir, vol / "revisions" / impostor.replace(":", "-"))
    try:
        with serving(vol) as c:
            r = c.post("/v1/transitions", {"target": impostor, "path": "WholeBundle"})
            assert r.status_code == 400 and "does not match" in r.json()["error"]
            assert c.get("/v1/identity").json()["identity"]["bundle"] == d["base"]
    finally:
        shutil.rmtree(vol / "revisions" / impostor.replace(":", "-"))


def test_current_pointing_outside_the_bundle_dir_fails_start(tmp_path, volume):
    from owner.runtime import StartupError

    vol, d = volume
    fake = tmp_path / "fake"
    fake.mkdir()
    os.symlink(open_revision(vol, d["base"]).dir, fake / "current")  # absolute, outside fake/
    owner = Owner(fake, CpuBackend())
    with pytest.raises(StartupError, match="outside"):
        owner.start()
    assert owner.state == "unloaded"


def test_current_must_name_a_revision_by_digest(tmp_path, volume):
    from owner.runtime import StartupError

    vol, d = volume
    fake = tmp_path / "fake"
    (fake / "revisions").mkdir(parents=True)
    import shutil
    shutil.copytree(open_revision(vol, d["base"]).dir, fake / "revisions" / "latest")
    os.symlink("revisions/latest", fake / "current")
    with pytest.raises(StartupError, match="not at a revisions/sha256-<hex>"):
        Owner(fake, CpuBackend()).start()


def test_warmup_runs_every_variant_before_ready(volume):
    vol, _ = volume
    backend = CountingCpuBackend()
    owner = Owner(vol, backend, warmup=True)
    assert owner.state == "loading"
    owner.start()
    try:
        assert owner.state == "ready"
        assert sorted(backend.ran) == sorted(backend.variants()) and len(backend.ran) == 2
    finally:
        owner.close()


def test_a_reload_that_compiles_anew_warms_up_and_one_that_keeps_the_graph_does_not(volume, reference):
    vol, d = volume
    backend = CountingCpuBackend()
    with serving(vol, backend, warmup=True) as c:
        backend.ran.clear()
        st = c.transition(d["graph"], strategy="Reload")
        assert (st["result"], st["graphReused"]) == ("succeeded", False)
        assert sorted(v for v in backend.ran if v) == sorted(backend.variants())
        assert st["timings"]["warmupSeconds"] > 0
        assert c.transition(d["base"], strategy="Reload")["timings"]["warmupSeconds"] > 0  # graph changes back
        backend.ran.clear()
        st = c.transition(d["rows"], strategy="Reload")  # same graph as base: kept
        assert (st["result"], st["graphReused"]) == ("succeeded", True)
        assert [v for v in backend.ran if v] == [] and st["timings"]["warmupSeconds"] is None
        assert c.generate().json()["tokens"] == reference[d["rows"]]
        metrics = c.get("/metrics", auth=False).text
        assert 'resident_owner_transition_duration_seconds_count{phase="warmup",strategy="Reload"} 2.0' in metrics


def test_start_failure_closes_the_engine(tmp_path):
    from owner.runtime import StartupError

    backend = CpuBackend()
    owner = Owner(tmp_path, backend)
    with pytest.raises(StartupError, match="no current revision"):
        owner.start()
    assert owner.state == "unloaded" and backend.decoder is None


def derive(vol, tmp, digest, name, edit):
    """Stage a copy of revision ``digest`` whose ``edit(dir)`` changed graph or config files
    (its weights file stays byte-identical); return its digest."""
    out = tmp / name
    shutil.copytree(open_revision(vol, digest).dir, out)
    edit(out)
    write_manifest(out, build_manifest(out, chunk_size=64 * 1024))
    return stage_revision(vol, out, hardlink=False)


def edit_json(name, **changes):
    def edit(bundle_dir):
        doc = json.loads((bundle_dir / name).read_text())
        doc.update(changes)
        (bundle_dir / name).write_text(json.dumps(doc))
    return edit


@pytest.fixture(scope="module")
def same_weights(volume, tmp_path_factory):
    """Revisions with base's weights file: ``rope`` (config.json's rope_theta changed, so the
    same weights answer differently), ``wide`` (d_ff changed: a config that implies other
    tensor shapes) and ``bad-op`` (a graph the compiler refuses)."""
    vol, d = volume
    tmp = tmp_path_factory.mktemp("same-weights")
    graph = json.loads((open_revision(vol, d["base"]).dir / "graph.json").read_text())
    config = json.loads((open_revision(vol, d["base"]).dir / "config.json").read_text())
    layers = [{**layer, "ops": layer["ops"] + ["teleport"]} for layer in graph["layers"]]
    out = {"rope": derive(vol, tmp, d["base"], "rope", edit_json("config.json", rope_theta=1000.0)),
           "wide": derive(vol, tmp, d["base"], "wide", edit_json("config.json", d_ff=config["d_ff"] + 2)),
           "bad-op": derive(vol, tmp, d["base"], "bad-op", edit_json("graph.json", layers=layers))}
    weights = open_revision(vol, d["base"]).manifest.weights_digest
    assert all(open_revision(vol, v).manifest.weights_digest == weights for v in out.values())
    return out


def cold_start(vol, digest):
    """What an owner started on ``digest`` answers (or the error its start gives)."""
    b = CpuBackend()
    try:
        b.load(open_revision(vol, digest))
    except Exception as e:  # noqa: BLE001 - the test compares the error too
        return f"{type(e).__name__}: {e}"
    return b.generate(PROMPT, 8).tokens


def test_a_graph_only_transition_keeps_the_live_weights_and_answers_as_a_cold_start(volume, reference,
                                                                                    same_weights):
    vol, d = volume
    with serving(vol) as c:
        arena = c.owner.backend.weights["lm_head.weight"]
        for target in (d["graph"], same_weights["rope"], d["base"]):
            st = c.transition(target, path="GraphOnly")
            assert (st["result"], st["strategy"], st["graphReused"], st["weightsReused"]) == (
                "succeeded", "Reload", False, True), st
            assert st["identity"] == identity_of(vol, target)
            # the same memory, not a new arena filled again (a full reload compiles a new one)
            assert c.owner.backend.weights["lm_head.weight"] is arena
            assert c.generate().json()["tokens"] == cold_start(vol, target)
        assert cold_start(vol, same_weights["rope"]) != reference[d["base"]]  # the new graph answers
        st = c.transition(d["whole"], strategy="Reload")   # other weights: a full reload
        assert (st["result"], st["graphReused"], st["weightsReused"]) == ("succeeded", True, False)
        assert c.generate().json()["tokens"] == reference[d["whole"]]
        c.transition(d["base"], strategy="Reload")


def test_a_graph_only_transition_that_fails_to_compile_leaves_the_old_revision_serving(volume, reference,
                                                                                       same_weights):
    vol, d = volume
    with serving(vol) as c:
        before = {n: w.copy() for n, w in c.owner.backend.weights.items()}
        st = c.transition(same_weights["bad-op"], path="GraphOnly")
        assert (st["result"], st["strategy"]) == ("failed", "Reload")
        assert "still serves" in st["reason"] and "unknown op 'teleport'" in st["reason"]
        assert st["identity"] == identity_of(vol, d["base"])
        ident = c.get("/v1/identity").json()
        assert (ident["state"], ident["identity"]) == ("ready", identity_of(vol, d["base"]))
        assert c.get("/readyz", auth=False).status_code == 200
        assert c.generate().json()["tokens"] == reference[d["base"]]
        assert all(np.array_equal(w, before[n]) for n, w in c.owner.backend.weights.items())
        st = c.transition(d["graph"], path="GraphOnly")   # and it can still move on
        assert (st["result"], st["weightsReused"]) == ("succeeded", True)
        c.transition(d["base"], strategy="Reload")


def test_same_weights_under_a_config_of_other_tensor_shapes_is_refused_and_the_old_revision_serves(
        volume, reference, same_weights):
    vol, d = volume
    assert "has shape" in cold_start(vol, same_weights["wide"])   # the weights cannot fill it
    with serving(vol) as c:
        arena = c.owner.backend.weights["lm_head.weight"]
        st = c.transition(same_weights["wide"], path="GraphOnly")
        # refused before anything live was closed, rather than a reload that cannot succeed
        assert st["result"] == "failed" and "still serves" in st["reason"]
        assert "other weight tensors" in st["reason"]
        ident = c.get("/v1/identity").json()
        assert (ident["state"], ident["identity"]) == ("ready", identity_of(vol, d["base"]))
        assert c.owner.backend.weights["lm_head.weight"] is arena
        assert c.generate().json()["tokens"] == reference[d["base"]]

def wait_result(c, tid, not_=("running",)):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = c.get(f"/v1/transitions/{tid}?waitSeconds=5").json()
        if st["result"] not in not_:
            return st
    raise AssertionError(f"transition {tid} stayed {not_}")


@pytest.mark.parametrize("strategy", ["InPlace", "Reload"])
def test_a_deferred_transition_prepares_serves_the_old_revision_then_commits(volume, reference, strategy):
    vol, d = volume
    with serving(vol) as c:
        r = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle", "strategy": strategy,
                                       "commit": "Deferred"})
        assert r.status_code == 202 and r.json()["commit"] == "Deferred", r.text
        tid = r.json()["id"]
        st = wait_result(c, tid)
        assert st["result"] == "prepared" and st["preparedAt"] and st["committedAt"] is None
        assert st["timings"]["stageSeconds"] is not None and st["timings"]["applySeconds"] is None
        # a reload prepares by loading the target beside the live revision: its commit swaps
        assert st["loadedBeside"] is (True if strategy == "Reload" else None)
        # prepared: the live revision answers, the owner stays in its Service
        assert c.generate().json()["tokens"] == reference[d["base"]]
        assert c.get("/readyz", auth=False).status_code == 200
        assert c.get("/v1/identity").json()["identity"] == identity_of(vol, d["base"])
        assert c.post(f"/v1/transitions/{tid}/commit", {}, headers={}).status_code == 401
        committed = c.post(f"/v1/transitions/{tid}/commit", {})
        assert committed.status_code == 200 and committed.json()["result"] in ("running", "succeeded")
        st = wait_result(c, tid)
        assert st["result"] == "succeeded" and st["strategy"] == strategy
        assert st["committedAt"] >= st["preparedAt"] and st["identity"] == identity_of(vol, d["rows"])
        assert st["firstTokenAt"] >= st["committedAt"]
        assert c.generate().json()["tokens"] == reference[d["rows"]]
        again = c.post(f"/v1/transitions/{tid}/commit", {})
        assert again.status_code == 409 and "succeeded, not prepared" in again.json()["error"]


def test_an_aborted_or_expired_prepare_changes_nothing_and_frees_the_owner(volume, reference):
    vol, d = volume
    with serving(vol) as c:
        tid = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle", "strategy": "InPlace",
                                         "commit": "Deferred"}).json()["id"]
        assert wait_result(c, tid)["result"] == "prepared"
        busy = c.post("/v1/transitions", {"target": d["graph"], "path": "WholeBundle"})
        assert busy.status_code == 409                        # one transition at a time, prepared too
        assert c.post(f"/v1/transitions/{tid}/abort", {}).status_code == 200
        st = wait_result(c, tid, ("running", "prepared"))
        assert st["result"] == "aborted" and "nothing changed" in st["reason"]
        assert st["identity"] == identity_of(vol, d["base"])
        assert c.post(f"/v1/transitions/{tid}/commit", {}).status_code == 409   # aborted for good
        assert c.get("/v1/identity").json()["state"] == "ready"
        assert c.generate().json()["tokens"] == reference[d["base"]]
        # no commit within holdSeconds: it aborts itself
        tid = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle", "commit": "Deferred",
                                         "holdSeconds": 0.3}).json()["id"]
        st = wait_result(c, tid, ("running", "prepared"))
        assert st["result"] == "aborted" and "no commit within 0.3s" in st["reason"]
        assert c.post("/v1/transitions/0123abcd/commit", {}).status_code == 404
        # a one-step transition is not prepared: it cannot be committed or aborted
        tid = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle"}).json()["id"]
        assert wait_result(c, tid)["result"] == "succeeded"
        assert c.post(f"/v1/transitions/{tid}/abort", {}).status_code == 409


def test_a_deferred_reload_without_memory_for_both_revisions_loads_at_its_commit(volume, reference, monkeypatch):
    from owner import transitions
    monkeypatch.setattr(transitions, "memory_available", lambda: 0)
    vol, d = volume
    with serving(vol) as c:
        tid = c.post("/v1/transitions", {"target": d["rows"], "path": "WholeBundle", "strategy": "Reload",
                                         "commit": "Deferred"}).json()["id"]
        st = wait_result(c, tid)
        assert st["result"] == "prepared" and st["loadedBeside"] is False
        assert c.generate().json()["tokens"] == reference[d["base"]]
        assert c.post(f"/v1/transitions/{tid}/commit", {}).status_code == 200
        st = wait_result(c, tid)
        assert st["result"] == "succeeded" and st["identity"] == identity_of(vol, d["rows"])
        assert c.generate().json()["tokens"] == reference[d["rows"]]


def test_a_deferred_reload_warms_its_target_up_beside_the_live_revision_before_the_commit(
        volume, reference, monkeypatch):
    """With warm-up on, the variants of a target loaded beside run while the live revision
    serves (in the prepare), so the commit is the swap alone: no warm-up after it."""
    from owner import transitions
    warmed = []

    def recording(backend, variant=None):
        warmed.append((backend, variant))
        return first_token(backend, variant)

    monkeypatch.setattr(transitions, "first_token", recording)
    vol, d = volume
    backend = CountingCpuBackend()
    with serving(vol, backend, warmup=True) as c:
        tid = c.post("/v1/transitions", {"target": d["graph"], "path": "WholeBundle", "strategy": "Reload",
                                         "commit": "Deferred"}).json()["id"]
        st = wait_result(c, tid)
        assert st["result"] == "prepared" and st["loadedBeside"] is True
        beside = {b for b, _ in warmed}
        assert len(beside) == 1 and backend not in beside    # the target's own backend, not the live one
        assert sorted(v for _, v in warmed) == sorted(next(iter(beside)).variants())
        backend.ran.clear()
        assert c.post(f"/v1/transitions/{tid}/commit", {}).status_code == 200
        st = wait_result(c, tid)
        assert (st["result"], st["graphReused"]) == ("succeeded", False)
        assert st["timings"]["warmupSeconds"] is None and backend.ran == [None]   # the first-token check only
        assert c.generate().json()["tokens"] == reference[d["graph"]]


def test_memory_available_reads_the_kernel_and_the_cgroup():
    from owner.transitions import memory_available
    assert 0 < memory_available() < 1 << 50


def wait_preload(c, state, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        preload = c.get("/v1/identity").json()["preload"]
        if preload and preload["state"] == state:
            return preload
        time.sleep(0.02)
    raise AssertionError(f"preload never {state}: {preload}")


def test_a_preloaded_revision_turns_a_reload_to_it_into_a_swap_and_the_owner_stays_ready(volume, reference):
    """spec.stage.preload: the owner loads a staged revision beside the live one ahead of
    the switch; a reload to it then swaps it in, with no drain and no gap: readiness and
    answers hold throughout, and the drain it was sent (5 s) is not waited out."""
    vol, d = volume
    with serving(vol) as c:
        assert c.get("/v1/identity").json()["preload"] is None
        r = c.post("/v1/preload", {"target": d["whole"]})
        assert r.status_code == 202 and r.json()["digest"] == d["whole"], r.text
        assert wait_preload(c, "loaded") == {"digest": d["whole"], "state": "loaded", "reason": ""}
        assert c.generate().json()["tokens"] == reference[d["base"]]          # the live revision serves on
        assert c.post("/v1/preload", {"target": d["whole"]}).json()["state"] == "loaded"   # asked again: as it is
        seen, stop = set(), threading.Event()

        def watch():
            while not stop.is_set():
                seen.add(c.get("/readyz", auth=False).status_code)
                time.sleep(0.005)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            r = c.post("/v1/transitions", {"target": d["whole"], "path": "WholeBundle", "strategy": "Reload",
                                           "drainSeconds": 5})
            st = wait_result(c, r.json()["id"])
        finally:
            stop.set()
            watcher.join()
        assert st["result"] == "succeeded" and st["strategy"] == "Reload", st
        assert st["preloaded"] is True and st["loadedBeside"] is True
        assert st["timings"]["totalSeconds"] < 5 and seen == {200}, (st["timings"], seen)
        assert st["identity"] == identity_of(vol, d["whole"])
        assert c.generate().json()["tokens"] == reference[d["whole"]]
        assert c.get("/v1/identity").json()["preload"] is None                 # taken by the swap


def test_preloads_are_refused_replaced_dropped_and_given_up_clearly(volume, reference, monkeypatch):
    vol, d = volume
    with serving(vol) as c:
        assert c.post("/v1/preload", {"target": d["rows"]}, headers={}).status_code == 401
        live = c.post("/v1/preload", {"target": d["base"]})
        assert live.status_code == 409 and "is the live revision" in live.json()["error"]
        missing = c.post("/v1/preload", {"target": "sha256:" + "e" * 64})
        assert missing.status_code == 404
        assert c.post("/v1/preload", {"target": "sha256:xyz"}).status_code == 400
        assert requests.delete(c.url + "/v1/preload", headers=AUTH, timeout=10).status_code == 404
        c.post("/v1/preload", {"target": d["rows"]})
        wait_preload(c, "loaded")
        c.post("/v1/preload", {"target": d["graph"]})                           # another: replaces it
        assert wait_preload(c, "loaded")["digest"] == d["graph"]
        dropped = requests.delete(c.url + "/v1/preload", headers=AUTH, timeout=10)
        assert dropped.status_code == 200 and dropped.json()["digest"] == d["graph"]
        assert c.get("/v1/identity").json()["preload"] is None
        # a switch to a preloaded revision that does not reload (in place) leaves it of no use: dropped
        c.post("/v1/preload", {"target": d["rows"]})
        wait_preload(c, "loaded")
        st = c.transition(d["rows"], strategy="InPlace")
        assert st["result"] == "succeeded" and st["preloaded"] is None
        assert c.get("/v1/identity").json()["preload"] is None
        # no memory for two revisions: it says so, and a reload to it loads as always
        from owner import transitions
        monkeypatch.setattr(transitions, "memory_available", lambda: 0)
        c.post("/v1/preload", {"target": d["whole"]})
        failed = wait_preload(c, "failed")
        assert "no memory for two revisions" in failed["reason"]
        st = c.transition(d["whole"], strategy="Reload")
        assert st["result"] == "succeeded" and st["preloaded"] is None
        assert c.generate().json()["tokens"] == reference[d["whole"]]
        assert c.get("/v1/identity").json()["preload"] is None
