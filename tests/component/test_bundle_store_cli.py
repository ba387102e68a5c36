"""``resident bundle`` end to end on small directories: build, verify, diff, push, and a
real store (SQLite) through materialize and gc. In-process, real files."""

from __future__ import annotations

import json
import os

import pytest

from bundle.cli import main, parse_size
from bundle.manifest import MANIFEST_NAME, Manifest
from resident_cli import main as resident_main

CS = "64KiB"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--quiet", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def two_revisions(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, data in ((a, b"\x01" * 300_000), (b, b"\x01" * 200_000 + b"\x02" * 100_000)):
        d.mkdir()
        (d / "model.safetensors").write_bytes(data)
        (d / "graph.onnx").write_bytes(b"graph")
        assert run(capsys, "build", str(d), "--chunk-size", CS)[0] == 0
    return a, b


def test_build_writes_the_manifest_and_prints_the_digest(tmp_path, capsys, two_revisions):
    a, _ = two_revisions
    m = Manifest.parse((a / MANIFEST_NAME).read_bytes())
    code, out, _ = run(capsys, "inspect", str(a), "--json")
    assert code == 0 and json.loads(out)["identity"]["bundle"] == m.digest
    assert {f["path"]: f["role"] for f in json.loads(out)["files"]} == {
        "model.safetensors": "weights", "graph.onnx": "graph"}
    code, out, _ = run(capsys, "build", str(a), "--chunk-size", CS, "--role", "graph.onnx=config")
    assert code == 0 and out.startswith("sha256:") and out.split()[0] != m.digest


def test_verify_passes_then_names_the_changed_file(tmp_path, capsys, two_revisions):
    a, _ = two_revisions
    assert run(capsys, "verify", str(a))[0] == 0
    with open(a / "model.safetensors", "r+b") as f:
        f.seek(70_000)
        f.write(b"\xff")
    code, _, err = run(capsys, "verify", str(a))
    assert code == 1 and "content differs: model.safetensors (chunks [1])" in err
    (a / "extra.txt").write_text("x")
    assert "not in the manifest: extra.txt" in run(capsys, "verify", str(a))[2]


def test_diff_shows_the_plan_and_predicted_bytes(capsys, two_revisions):
    a, b = two_revisions
    code, out, _ = run(capsys, "diff", str(a), str(b), "--json")
    plan = json.loads(out)
    assert code == 0 and plan["method"] == "rebase" and plan["path"] == "WholeBundle"
    # 300000 bytes in 64 KiB chunks: chunks 3 and 4 hold the changed bytes
    assert plan["changedChunks"] == {"model.safetensors": [3, 4]}
    assert plan["bytes"]["fetch"] == 300_000 - 3 * 65536
    code, out, _ = run(capsys, "diff", str(a), str(b), "--min-reuse", "0.9")
    assert code == 0 and "method   reconstruct" in out and "under minReuse 90.0%" in out


@pytest.mark.parametrize("argv,code,msg", [
    (["diff", "/nonexistent/a", "/nonexistent/b"], 2, "no such bundle"),
    (["build", "/nonexistent"], 2, "not a directory"),
    (["inspect", "/etc/hostname"], 2, "invalid manifest"),
    (["make-demo", "/tmp/x-never-made"], 2, "give --size"),
])
def test_bad_requests_exit_2_with_a_clear_message(capsys, argv, code, msg):
    got, _, err = run(capsys, *argv)
    assert got == code and msg in err


def test_graph_only_refusal_and_symlinked_bundle(tmp_path, capsys, two_revisions):
    a, b = two_revisions
    code, _, err = run(capsys, "diff", str(a), str(b), "--mode", "GraphOnly")
    assert code == 2 and "model.safetensors differs" in err
    (a / "evil").symlink_to("/etc/passwd")
    code, _, err = run(capsys, "build", str(a))
    assert code == 2 and "evil: symlinks are not allowed" in err


def test_push_materialize_and_gc_through_a_store(tmp_path, capsys, two_revisions):
    a, b = two_revisions
    code, out, _ = run(capsys, "push", str(a), f"file://{tmp_path}/pub-a")
    digest_a = out.split()[0]
    assert code == 0 and (tmp_path / "pub-a" / MANIFEST_NAME).is_file()
    assert run(capsys, "push", str(b), f"file://{tmp_path}/pub-b")[0] == 0
    digest_b = Manifest.parse((b / MANIFEST_NAME).read_bytes()).digest
    store = str(tmp_path / "store")
    code, out, _ = run(capsys, "materialize", "--store", store, f"file://{tmp_path}/pub-a", digest_a)
    assert code == 0 and json.loads(out)["method"] == "reconstruct"
    code, out, _ = run(capsys, "materialize", "--store", store, f"file://{tmp_path}/pub-b",
                       digest_b, "--donor", digest_a)
    res = json.loads(out)
    assert res["method"] == "rebase" and res["bytes"]["fetched"] == 300_000 - 3 * 65536 + 0
    assert open(os.path.join(res["path"], "model.safetensors"), "rb").read() == \
        (b / "model.safetensors").read_bytes()
    code, out, _ = run(capsys, "gc", "--store", store, "--high", "0", "--low", "0")
    assert code == 0 and sorted(json.loads(out)["removed"]) == sorted([digest_a, digest_b])
    code, _, err = run(capsys, "materialize", "--store", store, f"file://{tmp_path}/pub-a", digest_b)
    assert code == 1 and "integrity mismatch" in err  # wrong manifest served for that digest


def test_make_demo_and_revision(tmp_path, capsys):
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    assert run(capsys, "make-demo", str(d1), "--size", "256KiB", "--chunk-size", CS)[0] == 0
    code, _, _ = run(capsys, "make-demo", str(d2), "--from", str(d1), "--kind", "graph",
                     "--chunk-size", CS)
    assert code == 0
    code, out, _ = run(capsys, "diff", str(d1), str(d2), "--json")
    assert json.loads(out)["method"] == "graph-only"
    code, _, err = run(capsys, "make-demo", str(d2), "--size", "256KiB")
    assert code == 2 and "not empty" in err  # nothing overwritten
    assert run(capsys, "verify", str(d2))[0] == 0


def test_resident_dispatches_and_sizes_parse(capsys):
    assert resident_main(["bundle", "--quiet", "inspect", "/nonexistent"]) == 2
    assert parse_size("64MiB") == 64 << 20 and parse_size("2G") == 2 * 10**9
    assert parse_size("4096") == 4096
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "diff" in capsys.readouterr().out


def test_two_processes_materialize_one_revision_once(tmp_path, capsys, two_revisions):
    import subprocess
    import sys
    a, _ = two_revisions
    digest = Manifest.parse((a / MANIFEST_NAME).read_bytes()).digest
    cmd = [sys.executable, "-m", "resident_cli", "bundle", "--quiet", "materialize",
           "--store", str(tmp_path / "store"), f"file://{a}", digest]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    methods = sorted(json.loads(out)["method"] for out, _ in outs)
    assert methods == ["present", "reconstruct"]
    assert sum(json.loads(out)["bytes"]["fetched"] for out, _ in outs) == 300_000 + len(b"graph")


def test_progress_reports_every_byte_once(tmp_path, two_revisions):
    from bundle.sources import open_source
    from bundle.store import Store
    a, b = two_revisions
    ma = Manifest.parse((a / MANIFEST_NAME).read_bytes())
    mb = Manifest.parse((b / MANIFEST_NAME).read_bytes())
    store, seen = Store(tmp_path / "store"), []
    store.materialize(ma, open_source(f"file://{a}"), progress=seen.append)
    assert sum(seen) == ma.total_bytes
    seen.clear()
    store.materialize(mb, open_source(f"file://{b}"), donor=ma.digest, progress=seen.append)
    assert sum(seen) == mb.total_bytes
