"""Fetch one bundle, chunk by chunk with verification, from file://, http://, oci://, s3://
and hf:// sources; and deliver a second commit of an hf:// repository that differs in one
tensor from the first.

Arms, all on this machine over 127.0.0.1, each a real server:
- ``file``: a bundle directory (``push`` to file://);
- ``http``: ``python -m bundle.sources.httpserve`` in its own process, http layout;
- ``oci``: Debian's docker-registry, OCI artifact layout;
- ``s3``: SeaweedFS's S3 gateway (testkit.s3_server), the http layout in a bucket, requests
  signed with the test identity's credentials;
- ``hf``: olah (testkit.hf_server) serving a git repository (git-lfs for the weights and
  the graph) whose files are the bundle's files, so the commit makes the same bundle digest.

Each sample opens the source, fetches the manifest (digest-checked) and reads every chunk
of every file through ``fetch_verified`` (one Range request per chunk + sha256), as the
node store verifies it, and records seconds and bytes. The hf source has no manifest to
fetch: it *makes* one from the commit (lists the files, reads and hashes each file whole).
An hf sample therefore starts a fresh process state (``MADE`` cleared), times the making
(``make_seconds``) and then, separately, the chunk fetch with the manifest made
(``seconds``, the figure compared with the other arms); it also counts what olah answered
to the Range requests (olah answers 200 with the file from byte 0: ``wire_bytes_at_least``).
Rounds alternate the arm order (benchkit). Each read also records this process's CPU
time (``cpu_seconds``, ``runs_cpu_seconds``: the reader's own work, not the server's, which
runs in its own process on the same two cores).

After the rounds, once (bytes are deterministic): commit B of the hf repository replaces one
tensor of ``model.safetensors``; a store holding commit A (delivered from the hf source)
delivers B as the bridge stages a revision: ``fetch_manifest`` (making B's manifest, A's
known in the process), then ``Store.materialize(manifest, source, donor=A)``. Recorded: the
bytes the delivery fetched, the bytes making B's manifest read, and the tensor's size.

Usage: ``python experiments/04-source-fetch/run.py [--mib 256] [--rounds 7] [--out DIR]``
(writes raw.json and summary.json into ``--out``, by default this folder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import benchkit  # noqa: E402
from bundle.manifest import chunk_range  # noqa: E402
from bundle.materialize import Tally, fetch_run  # noqa: E402
from bundle.scan import build_manifest, read_manifest, write_manifest  # noqa: E402
from bundle.sources import fetch_verified, open_source, push  # noqa: E402
from bundle.sources.hf import MADE  # noqa: E402
from bundle.sources.metrics import FETCHED_BYTES  # noqa: E402
from bundle.store import Store  # noqa: E402
from localcluster.processes import ProcessGroup, free_port  # noqa: E402
from testkit.hf_server import HubRepo, running_hub  # noqa: E402
from testkit.s3_server import CREDENTIALS, admin_client, make_bucket, running_s3  # noqa: E402

CHUNK = 4 * 1024 * 1024
TENSORS = 16                           # model.safetensors holds 16 equal float32 tensors
CHANGED = f"layers.{TENSORS // 2}.weight"   # the tensor commit B replaces
WEIGHTS = "model.safetensors"
HF_REPO = "bench/model"

# earlier run (file, http, oci only): its raw.json has no "delta"; recompute keeps its summary
EARLIER_RATIOS = {"http_over_file": ("http", "file"), "oci_over_file": ("oci", "file"),
                  "oci_over_http": ("oci", "http")}
RATIOS = {**EARLIER_RATIOS, "s3_over_file": ("s3", "file"), "hf_over_file": ("hf", "file"),
          "s3_over_http": ("s3", "http"), "hf_over_http": ("hf", "http")}
# the same ratios of the file-by-file read (runs_seconds), in runs the samples have it
RUN_RATIOS = {f"{name}_runs": arms for name, arms in RATIOS.items()}
# issue 28's targets: stated, not claimed; summary.json says whether met (ratio <= target)
TARGETS = {"s3_over_file": 1.3, "hf_over_file": 1.3, "hf_first_over_file": 1.3}
RUN_TARGETS = {"s3_over_file_runs": 1.3, "hf_over_file_runs": 1.3}


# -- the bundle and the repository ----------------------------------------------------
def make_bundle(root: Path, mib: int) -> Path:
    """A weights file of ``mib`` MiB as a real safetensors file (16 float32 tensors of
    random bytes), a 512 KiB graph and a small config; the manifest beside them."""
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    per = mib * 2**20 // TENSORS
    save_file({f"layers.{i}.weight": np.frombuffer(os.urandom(per), dtype=np.float32)
               for i in range(TENSORS)}, str(root / WEIGHTS))
    (root / "graph.onnx").write_bytes(os.urandom(512 * 1024))
    (root / "config.json").write_bytes(b'{"layers": 2}')
    write_manifest(root, build_manifest(root, chunk_size=CHUNK))
    return root


def tensor_span(data: bytes, name: str) -> tuple[int, int, int]:
    """(header bytes, start, end) of tensor ``name`` in a safetensors file's bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    start, end = json.loads(data[8:8 + n])[name]["data_offsets"]
    return 8 + n, 8 + n + start, 8 + n + end


def hf_uri(endpoint: str, commit: str, chunking: str = "fixed") -> str:
    cut = "&chunking=tensors" if chunking == "tensors" else ""
    return f"hf://{HF_REPO}@{commit}?endpoint={endpoint}&chunk={CHUNK}{cut}"


# -- fetching -------------------------------------------------------------------------
def fetch_chunks(src, digest: str) -> int:
    """The manifest, then every chunk of every file through fetch_verified; bytes read."""
    m = src.fetch_manifest(digest)
    n = 0
    for f in m.files:
        if not f.chunks:
            n += len(fetch_verified(src, f, 0, f.size, f.sha256))
        for i, sha in enumerate(f.chunks):
            off, length = chunk_range(f, i, m.chunk_size)
            n += len(fetch_verified(src, f, off, length, sha, chunk=i))
    return n


def fetch_files(src, digest: str) -> int:
    """The manifest, then every file as one run, as a delivery to an empty store reads it:
    one read of the source per file, streamed and verified chunk by chunk
    (``bundle.materialize.fetch_run``), into /dev/null; bytes read."""
    m = src.fetch_manifest(digest)
    tally = Tally()
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        for f in m.files:
            fetch_run(src, f, 0, max(0, len(f.chunks) - 1), m.chunk_size, fd, tally, None)
    finally:
        os.close(fd)
    return tally.fetched


def fetch_all(uri: str, digest: str, credentials=None) -> dict:
    """Both reads of the bundle, each from a freshly opened source: chunk by chunk (the
    per-arm figure since the first run), then file by file (``runs_seconds``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    with open_source(uri, credentials=credentials) as src:
        n = fetch_chunks(src, digest)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    with open_source(uri, credentials=credentials) as src:
        runs_bytes = fetch_files(src, digest)
    runs_seconds, runs_cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": seconds, "bytes": n, "mib_per_second": n / seconds / 2**20,
            "cpu_seconds": cpu, "runs_seconds": runs_seconds, "runs_bytes": runs_bytes,
            "runs_cpu_seconds": runs_cpu}


class RangeAnswers:
    """A ``requests`` response hook on an hf source's session: what the server answered to
    each Range GET. A 200 is the file from byte 0 (olah ignores Range), so the client read
    at least up to the end of the range; a 206 is the range alone."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, int, int]] = []   # (status, first, last)

    def __call__(self, resp, *args, **kwargs):
        rng = resp.request.headers.get("Range", "")
        if rng.startswith("bytes="):
            first, _, last = rng[len("bytes="):].partition("-")
            self.answers.append((resp.status_code, int(first), int(last)))
        return resp

    def tally(self, since: int = 0) -> dict:
        got = self.answers[since:]
        status: dict[str, int] = {}
        for code, _, _ in got:
            status[str(code)] = status.get(str(code), 0) + 1
        wire = sum(last + 1 if code == 200 else last - first + 1 for code, first, last in got)
        return {"requests": len(got), "status": status, "wire_bytes_at_least": wire}


def fetch_hf(uri: str, digest: str) -> dict:
    """A first fetch of the commit in a process: make the manifest (timed apart), then the
    same chunk fetch as the other arms, the manifest now at hand."""
    MADE.clear()
    answers = RangeAnswers()
    t0 = time.perf_counter()
    with open_source(uri) as src:
        src.session.hooks["response"].append(answers)
        src.fetch_manifest(digest)     # lists the commit, reads and hashes every file whole
        t1, c1 = time.perf_counter(), time.process_time()
        made = answers.tally()
        n = fetch_chunks(src, digest)  # fetch_manifest is now the made one: no request
        fetched = answers.tally(since=made["requests"])
        t2, c2 = time.perf_counter(), time.process_time()
        runs_bytes = fetch_files(src, digest)   # the manifest still made: the runs alone
        t3, c3 = time.perf_counter(), time.process_time()
        runs = answers.tally(since=made["requests"] + fetched["requests"])
    return {"seconds": t2 - t1, "bytes": n, "mib_per_second": n / (t2 - t1) / 2**20,
            "make_seconds": t1 - t0, "make_requests": made, "fetch_requests": fetched,
            "cpu_seconds": c2 - c1, "runs_seconds": t3 - t2, "runs_bytes": runs_bytes,
            "runs_cpu_seconds": c3 - c2, "runs_requests": runs}


def hf_fetched() -> float:
    return FETCHED_BYTES.labels("hf")._value.get()


def commit_one_tensor_changed(repo: HubRepo, bundle: Path) -> str:
    """Commit B = A with tensor CHANGED replaced (same dtype and shape: the header is unchanged)."""
    data = bytearray((bundle / WEIGHTS).read_bytes())
    _, start, end = tensor_span(bytes(data), CHANGED)
    data[start:end] = os.urandom(end - start)
    return repo.commit({WEIGHTS: bytes(data)}, f"replace {CHANGED}")


def one_tensor_delta(endpoint: str, commit_a: str, commit_b: str, work: Path,
                     chunking: str = "fixed") -> dict:
    """Deliver commit A to an empty store, then B with A as donor the way the bridge stages
    it, both made with ``chunking``; the bytes each step moved."""
    MADE.clear()
    store = Store(work / f"store-{chunking}")
    first_answers = RangeAnswers()
    with open_source(hf_uri(endpoint, commit_a, chunking)) as src:   # a node that holds nothing yet
        src.session.hooks["response"].append(first_answers)
        ma = src.manifest()
        made_a = first_answers.tally()
        t0 = time.perf_counter()
        first = store.materialize(ma, src)   # contiguous chunks: one Range request per file
        first_seconds = time.perf_counter() - t0
        first_requests = first_answers.tally(since=made_a["requests"])

    answers = RangeAnswers()
    with open_source(hf_uri(endpoint, commit_b, chunking)) as src:
        src.session.hooks["response"].append(answers)
        before, t0 = hf_fetched(), time.perf_counter()
        mb = src.manifest()          # what fetch_manifest(B's digest) makes, A's manifest known
        make_seconds, make_bytes = time.perf_counter() - t0, hf_fetched() - before
        made = answers.tally()
        before, t0 = hf_fetched(), time.perf_counter()
        res = store.materialize(mb, src, donor=ma.digest)
        seconds, metric = time.perf_counter() - t0, hf_fetched() - before
        delivered = answers.tally(since=made["requests"])
    new, old = mb.by_path()[WEIGHTS], ma.by_path()[WEIGHTS]
    changed_chunks = [i for i, (a, b) in enumerate(zip(old.chunks, new.chunks)) if a != b]
    header, start, end = tensor_span((store.revision_path(mb.digest) / WEIGHTS).read_bytes(), CHANGED)
    return {"chunking": chunking, "tensor": CHANGED, "tensor_bytes": end - start,
            "tensor_start": start, "tensor_end": end,
            "safetensors_header_bytes": header, "manifest_bytes": len(mb.canonical_json()),
            "weights_bytes": new.size, "chunk_bytes": mb.chunk_size,
            "chunks_touched_by_tensor": (end - 1) // mb.chunk_size - start // mb.chunk_size + 1,
            "chunks_changed": changed_chunks,
            "changed_chunk_bytes": sum(chunk_range(new, i, mb.chunk_size)[1] for i in changed_chunks),
            "commit_a": commit_a, "commit_b": commit_b,
            "digest_a": ma.digest, "digest_b": mb.digest,
            "first_delivery_fetched_bytes": first.bytes_fetched, "first_delivery_seconds": first_seconds,
            "first_delivery_requests": first_requests,
            "make_read_bytes": int(make_bytes), "make_seconds": make_seconds, "make_requests": made,
            "delivery_fetched_bytes": res.bytes_fetched, "delivery_metric_bytes": int(metric),
            "delivery_reused_bytes": res.bytes_reused, "delivery_method": res.method,
            "delivery_seconds": seconds, "delivery_requests": delivered}


# -- the run --------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=128, help="size of the weights file in MiB")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (>= 5)")
    ap.add_argument("--out", type=Path, default=HERE, help="where raw.json and summary.json go")
    args = ap.parse_args()
    before = benchkit.machine()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        tmp = Path(tmp)
        bundle = make_bundle(tmp / "bundle", args.mib)
        digest = read_manifest(bundle).digest
        group = ProcessGroup(tmp / "logs")
        servers.callback(group.stop)
        http_port, reg_port = free_port(), free_port()
        group.start("httpserve", [sys.executable, "-m", "bundle.sources.httpserve",
                                  "--root", str(tmp / "http"), "--port", str(http_port)])
        (tmp / "registry.yml").write_text(
            f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {tmp / 'registry'}\nhttp:\n  addr: 127.0.0.1:{reg_port}\n")
        group.start("docker-registry", ["/usr/bin/docker-registry", "serve", str(tmp / "registry.yml")])
        s3_endpoint = servers.enter_context(running_s3(tmp / "s3"))
        hub_endpoint, mirrors = servers.enter_context(running_hub(tmp / "hub"))
        group.await_http(f"http://127.0.0.1:{http_port}/metrics", "httpserve", 20)
        group.await_http(f"http://127.0.0.1:{reg_port}/v2/", "docker-registry", 20)
        make_bucket(admin_client(s3_endpoint), "bench")

        uris = {"file": f"file://{tmp / 'published'}",
                "http": f"http://127.0.0.1:{http_port}/bench",
                "oci": f"oci://127.0.0.1:{reg_port}/bench/model:v1",
                "s3": f"s3://bench/model?endpoint={s3_endpoint}"}
        for arm, uri in uris.items():
            got = push(bundle, uri, credentials=CREDENTIALS if arm == "s3" else None)
            if got != digest:
                raise SystemExit(f"{arm}: push gave {got}, the bundle is {digest}")
        # the same files as a Hub repository (weights and graph through git-lfs, as the Hub's
        # default .gitattributes has them); its commit must make the same bundle
        repo = HubRepo(mirrors, HF_REPO, lfs=("*.safetensors", "*.onnx"))
        commit_a = repo.commit({f.path: (bundle / f.path).read_bytes()
                                for f in read_manifest(bundle).files}, "the bundle's files")
        uris["hf"] = hf_uri(hub_endpoint, commit_a)
        with open_source(uris["hf"]) as src:
            made = src.manifest().digest
        if made != digest:
            raise SystemExit(f"hf: commit {commit_a} makes {made}, the bundle is {digest}")

        arms = {arm: (lambda u=uri, c=(CREDENTIALS if arm == "s3" else None): fetch_all(u, digest, c))
                for arm, uri in uris.items() if arm != "hf"}
        arms["hf"] = lambda: fetch_hf(uris["hf"], digest)
        samples = benchkit.run_rounds(args.rounds, arms)
        commit_b = commit_one_tensor_changed(repo, bundle)
        delta = one_tensor_delta(hub_endpoint, commit_a, commit_b, tmp)
        delta_tensors = one_tensor_delta(hub_endpoint, commit_a, commit_b, tmp, "tensors")
    MADE.clear()
    raw = {"bundle_mib": args.mib, "chunk_bytes": CHUNK, "rounds": args.rounds, "tensors": TENSORS,
           "bundle_digest": digest, "uris": {k: v.replace(str(tmp), "TMP") for k, v in uris.items()},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples, "delta": delta,
           "delta_tensors": delta_tensors}
    summary = recompute(raw)
    args.out.mkdir(parents=True, exist_ok=True)
    benchkit.write(args.out, raw, summary)
    print(json.dumps({"ratios": summary["ratios"], "targets": summary["targets"]}, indent=1))


# -- the summary ----------------------------------------------------------------------
def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    if "delta" not in raw:   # the earlier run: file, http and oci only
        return benchkit.summarize(samples, "seconds", EARLIER_RATIOS)
    summary = benchkit.summarize(samples, "seconds", RATIOS)
    hf = [s for s in samples if s["arm"] == "hf"]
    file_median = summary["arms"]["file"]["median"]
    first = benchkit.stats([s["make_seconds"] + s["seconds"] for s in hf])
    delivered = benchkit.stats([s["bytes"] for s in hf])["median"]
    wire = benchkit.stats([s["fetch_requests"]["wire_bytes_at_least"] for s in hf])["median"]
    summary["hf"] = {
        "make_seconds": benchkit.stats([s["make_seconds"] for s in hf]),
        "first_fetch_seconds": first,          # making the manifest + the chunk fetch
        "fetch_wire_bytes_at_least": wire,     # what olah sent for the chunk fetch, at least
        "fetch_wire_over_delivered": wire / delivered if delivered else None,
        "make_wire_bytes_at_least": benchkit.stats(
            [s["make_requests"]["wire_bytes_at_least"] for s in hf])["median"]}
    summary["ratios"]["hf_first_over_file"] = first["median"] / file_median if file_median else None
    targets = dict(TARGETS)
    if all("runs_seconds" in s for s in samples):
        runs = benchkit.summarize(samples, "runs_seconds", RUN_RATIOS)
        summary["runs_arms"] = runs["arms"]
        summary["ratios"].update(runs["ratios"])
        targets.update(RUN_TARGETS)
    for metric in ("cpu_seconds", "runs_cpu_seconds"):   # the reader's own CPU (runs since 2026-12-06)
        if all(metric in s for s in samples):
            cpu = benchkit.summarize(samples, metric, RATIOS)
            summary[f"{metric.removesuffix('seconds')}arms"] = cpu["arms"]
            summary[f"{metric.removesuffix('_seconds')}_ratios"] = cpu["ratios"]
    summary["targets"] = {name: {"target": want, "ratio": summary["ratios"][name],
                                 "met": summary["ratios"][name] is not None and summary["ratios"][name] <= want}
                          for name, want in targets.items()}

    for key, suffix in (("delta", ""), ("delta_tensors", "_tensors")):
        if key in raw:   # delta_tensors: runs since chunking=tensors (2026-12-06)
            summary[key], delivery, node = delta_summary(raw[key])
            summary["targets"][f"hf_delta_delivery{suffix}"] = delivery
            summary["targets"][f"hf_delta_node{suffix}"] = node   # the same target, all the node read
    return summary


def delta_summary(d: dict) -> tuple[dict, dict, dict]:
    """What one one-tensor delta moved, and the issue's limit (tensor + safetensors header +
    manifest) held against the delivery and against all the node read."""
    limit = d["tensor_bytes"] + d["safetensors_header_bytes"] + d["manifest_bytes"]
    span = d["chunks_touched_by_tensor"] * d["chunk_bytes"]
    moved = d.get("changed_chunk_bytes", span)   # the earlier runs' chunks were fixed slices
    node = d["make_read_bytes"] + d["delivery_fetched_bytes"]
    summary = {
        "chunking": d.get("chunking", "fixed"), "tensor_bytes": d["tensor_bytes"],
        "chunk_bytes": d["chunk_bytes"],
        "metadata_bytes": d["safetensors_header_bytes"] + d["manifest_bytes"],
        "chunk_span_bytes": span, "changed_chunk_bytes": moved,
        "delivery_fetched_bytes": d["delivery_fetched_bytes"],
        # the delivery moved exactly the chunks that changed, nothing else
        "delivery_is_changed_chunks": d["delivery_fetched_bytes"] == moved,
        "delivery_wire_bytes_at_least": d["delivery_requests"]["wire_bytes_at_least"],
        "make_read_bytes": d["make_read_bytes"], "node_bytes": node}
    return (summary,
            {"target_bytes": limit, "bytes": d["delivery_fetched_bytes"],
             "met": d["delivery_fetched_bytes"] <= limit},
            {"target_bytes": limit, "bytes": node, "met": node <= limit})


if __name__ == "__main__":
    main()
