"""The bundle CLI end to end on the generated demo model, through all three source kinds.

``resident bundle make-demo`` a small model and a ``rows`` revision of it, ``build`` and
``verify`` both, ``push`` both to a file:// target, to a real ``python -m
bundle.sources.httpserve`` and to Debian's real ``docker-registry`` (both started here on
127.0.0.1 and stopped by PID), then per source: ``materialize`` the base into a fresh store
and the revision with ``--donor`` the base, which must be a rebase fetching only the changed
chunks, and the materialized tree must ``verify`` and equal the pushed revision byte for byte.
Everything goes through ``bundle.cli.main`` in-process, exactly as ``resident bundle`` runs it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
import requests

from bundle.cli import main
from bundle.manifest import MANIFEST_NAME, Manifest
from localcluster.processes import ProcessGroup, free_port

from servers import running_registry, wait_for

SIZE = "4MiB"
CHUNK = "64KiB"

pytestmark = pytest.mark.timeout(120)


def cli(*argv: str) -> tuple[int, str, str]:
    """``resident bundle --quiet ARGV`` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--quiet", *argv])
    return code, out.getvalue(), err.getvalue()


def ok(*argv: str) -> str:
    code, out, err = cli(*argv)
    assert code == 0, f"resident bundle {' '.join(argv)} exited {code}: {err}"
    return out


def first_digest(out: str) -> str:
    digest = out.split()[0]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), out
    return digest


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by relative path, with its bytes."""
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            assert p.is_file() and not p.is_symlink(), p
            files[str(p.relative_to(root))] = p.read_bytes()
    return files


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo model and its rows revision, each built and verified by the CLI."""
    work = tmp_path_factory.mktemp("demo")
    base, rows = work / "base", work / "rows"
    made = {}
    made["base"] = first_digest(ok("make-demo", str(base), "--size", SIZE, "--chunk-size", CHUNK))
    made["rows"] = first_digest(ok("make-demo", str(rows), "--from", str(base), "--kind", "rows",
                                   "--chunk-size", CHUNK))
    assert made["base"] != made["rows"]
    digests = {}
    for name, d in (("base", base), ("rows", rows)):
        # build again from the bytes on disk: the same manifest make-demo wrote
        built = json.loads(ok("build", str(d), "--chunk-size", CHUNK, "--json"))
        assert built["bundle"] == made[name]
        assert built["bytes"] > 4 << 20 and built["files"] >= 2
        assert ok("verify", str(d)).startswith(f"ok {made[name]} ")
        digests[name] = made[name]
    m_base = Manifest.parse((base / MANIFEST_NAME).read_bytes())
    m_rows = Manifest.parse((rows / MANIFEST_NAME).read_bytes())
    assert m_rows.chunk_size == 64 * 1024 and m_rows.digest == digests["rows"]
    plan = json.loads(ok("diff", str(base), str(rows), "--json"))
    assert plan["method"] == "rebase" and plan["donor"] == digests["base"]
    assert 0 < plan["bytes"]["fetch"] < m_rows.total_bytes // 4  # a rows change: few chunks
    return {"base": base, "rows": rows, "digests": digests, "plan": plan,
            "manifests": {"base": m_base, "rows": m_rows}}


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """``python -m bundle.sources.httpserve`` on 127.0.0.1; yields its URL."""
    work = tmp_path_factory.mktemp("httpserve")
    port = free_port()
    group = ProcessGroup(work / "logs")
    try:
        group.start("httpserve", [sys.executable, "-m", "bundle.sources.httpserve",
                                  "--root", str(work / "root"), "--host", "127.0.0.1",
                                  "--port", str(port)])
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/metrics", group, "httpserve")
        yield url
    finally:
        group.stop()


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory):
    """Debian's docker-registry with filesystem storage on 127.0.0.1; yields host:port."""
    with running_registry(tmp_path_factory.mktemp("registry")) as (hostport, _):
        yield hostport


def sent_bytes(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    m = re.search(r"^resident_bundle_server_sent_bytes_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def publish(scheme: str, request, tmp_path, demo) -> dict[str, str]:
    """Push base and rows with the CLI; the source URI to materialize each one from."""
    if scheme == "file":
        targets = {name: f"file://{tmp_path / ('pub-' + name)}" for name in ("base", "rows")}
        sources = targets
    elif scheme == "http":
        uri = request.getfixturevalue("http_server") + f"/models/demo-{tmp_path.name}"
        targets = sources = {"base": uri, "rows": uri}
    else:
        repo = f"oci://{request.getfixturevalue('oci_registry')}/resident/demo-{os.getpid()}"
        targets = {name: f"{repo}:{name}" for name in ("base", "rows")}
        sources = {"base": repo, "rows": repo}  # read by digest, no tag needed
    for name in ("base", "rows"):
        out = ok("push", str(demo[name]), targets[name])
        assert first_digest(out) == demo["digests"][name]
        assert f"pushed to {targets[name]}" in out
    return sources


@pytest.mark.parametrize("scheme", ["file", "http", "oci"])
def test_demo_pushed_then_materialized_by_rebase_from_the_previous_revision(
        scheme, request, tmp_path, demo):
    base_d, rows_d = demo["digests"]["base"], demo["digests"]["rows"]
    m_base, m_rows = demo["manifests"]["base"], demo["manifests"]["rows"]
    sources = publish(scheme, request, tmp_path, demo)
    if scheme == "file":  # the pushed copies are what the store reads from
        assert tree(tmp_path / "pub-rows") == tree(demo["rows"])
    if scheme == "oci":
        from bundle.sources import open_source
        with open_source(sources["rows"]) as src:
            assert src.resolve("base") == base_d and src.resolve("rows") == rows_d

    store = str(tmp_path / "store")
    assert not Path(store).exists()  # a fresh store per source

    res = json.loads(ok("materialize", "--store", store, sources["base"], base_d))
    assert res["digest"] == base_d and res["method"] == "reconstruct" and res["verified"] is True
    distinct = {f.sha256: f.size for f in m_base.files}
    assert res["bytes"]["fetched"] == sum(distinct.values())  # nothing to reuse yet
    base_path = Path(res["path"])
    assert ok("verify", str(base_path)).startswith(f"ok {base_d} ")
    assert tree(base_path) == tree(demo["base"])

    before = sent_bytes(request.getfixturevalue("http_server")) if scheme == "http" else None
    res = json.loads(ok("materialize", "--store", store, sources["rows"], rows_d,
                        "--donor", base_d))
    assert res["digest"] == rows_d and res["verified"] is True
    assert res["method"] == "rebase" and res["fallbackReason"] is None
    fetched, reused = res["bytes"]["fetched"], res["bytes"]["reused"]
    total = m_rows.total_bytes
    assert 0 < fetched < total // 4, res
    assert fetched == demo["plan"]["bytes"]["fetch"]  # exactly the changed chunks the diff named
    assert reused == demo["plan"]["bytes"]["reuse"] and fetched + reused == total
    if scheme == "http":  # the bytes really crossed the wire, and no more than that
        manifest_size = (demo["rows"] / MANIFEST_NAME).stat().st_size
        sent = sent_bytes(request.getfixturevalue("http_server")) - before
        assert fetched <= sent <= fetched + manifest_size, (sent, fetched)

    rows_path = Path(res["path"])
    assert rows_path != base_path
    code, out, err = cli("verify", str(rows_path))
    assert code == 0 and out.startswith(f"ok {rows_d} ({len(m_rows.files)} files, {total} bytes"), err
    assert tree(rows_path) == tree(demo["rows"])
    # the donor is untouched by the rebase
    assert tree(base_path) == tree(demo["base"])
