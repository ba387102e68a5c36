"""Fetch one bundle, chunk by chunk with verification, from file://, http:// and oci://.

Arms: ``file`` (a bundle directory), ``http`` (``python -m bundle.sources.httpserve`` in its
own process) and ``oci`` (Debian's docker-registry), all on this machine over 127.0.0.1.
Each sample reads every chunk of every file through ``fetch_verified`` (Range request +
sha256), as the node store does, and records seconds and bytes. Rounds alternate the arm
order (benchkit). Usage: ``python experiments/04-source-fetch/run.py [--mib 128] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import benchkit  # noqa: E402
from bundle.manifest import chunk_range  # noqa: E402
from bundle.scan import build_manifest, write_manifest  # noqa: E402
from bundle.sources import fetch_verified, open_source, push  # noqa: E402
from localcluster.processes import ProcessGroup, free_port  # noqa: E402

CHUNK = 4 * 1024 * 1024


def make_bundle(root: Path, mib: int) -> Path:
    root.mkdir(parents=True)
    with open(root / "model.safetensors", "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1024 * 1024))
    (root / "graph.onnx").write_bytes(os.urandom(512 * 1024))
    (root / "config.json").write_bytes(b'{"layers": 2}')
    write_manifest(root, build_manifest(root, chunk_size=CHUNK))
    return root


def wait_http(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def fetch_all(uri: str, digest: str) -> dict:
    t0 = time.perf_counter()
    n = 0
    with open_source(uri) as src:
        m = src.fetch_manifest(digest)
        for f in m.files:
            if not f.chunks:
                n += len(fetch_verified(src, f, 0, f.size, f.sha256))
            for i, sha in enumerate(f.chunks):
                off, length = chunk_range(f, i, m.chunk_size)
                n += len(fetch_verified(src, f, off, length, sha, chunk=i))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "bytes": n, "mib_per_second": n / seconds / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=128, help="size of the weights file in MiB")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (>= 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bundle = make_bundle(tmp / "bundle", args.mib)
        group = ProcessGroup(tmp / "logs")
        try:
            http_port, reg_port = free_port(), free_port()
            group.start("httpserve", [sys.executable, "-m", "bundle.sources.httpserve",
                                      "--root", str(tmp / "http"), "--port", str(http_port)])
            (tmp / "registry.yml").write_text(
                f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {tmp / 'registry'}\nhttp:\n  addr: 127.0.0.1:{reg_port}\n")
            group.start("docker-registry", ["/usr/bin/docker-registry", "serve", str(tmp / "registry.yml")])
            wait_http(f"http://127.0.0.1:{http_port}/metrics")
            wait_http(f"http://127.0.0.1:{reg_port}/v2/")
            uris = {"file": f"file://{tmp / 'published'}",
                    "http": f"http://127.0.0.1:{http_port}/bench",
                    "oci": f"oci://127.0.0.1:{reg_port}/bench/model:v1"}
            digests = {arm: push(bundle, uri) for arm, uri in uris.items()}
            assert len(set(digests.values())) == 1
            digest = digests["file"]
            samples = benchkit.run_rounds(args.rounds, {
                arm: (lambda u=uri: fetch_all(u, digest)) for arm, uri in uris.items()})
        finally:
            group.stop()
    raw = {"bundle_mib": args.mib, "chunk_bytes": CHUNK, "rounds": args.rounds,
           "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(), "samples": samples}
    summary = recompute(raw)
    benchkit.write(HERE, raw, summary)
    print(summary)


def recompute(raw: dict) -> dict:
    return benchkit.summarize(raw["samples"], "seconds", {
        "http_over_file": ("http", "file"), "oci_over_file": ("oci", "file"),
        "oci_over_http": ("oci", "http")})


if __name__ == "__main__":
    main()
