"""``resident bundle serve-demo``: a first model to try Resident with, generated, served, described.

A fresh installation has no bundle anywhere, so the README's first model needs one. This
command generates the demo model (deterministic: the same size and seed always give the
same digest), publishes it to a bundle server of its own (the http layout of
``bundle.sources.httpserve``), and prints the ResidentModel that keeps it resident. With
the defaults that is exactly ``examples/residentmodel.yaml``; a test keeps the two equal.

It serves until Ctrl-C or SIGTERM, then removes what it generated (unless ``--dir`` named a
directory to keep). It binds 127.0.0.1 by default and names the source as the project's
local cluster reaches it: that cluster's nodes call this machine's ``127.0.0.1:8700`` at
``10.200.0.1:8700`` (docs/local-cluster.md). For another cluster, bind an address its nodes
reach (``--host 0.0.0.0``) and say which (``--url http://ADDRESS:8700``).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from . import cpu_model
from .manifest import MANIFEST_NAME
from .scan import read_manifest
from .sources import push
from .sources.httpserve import BundleServer

NAME = "tiny-lm"
SIZE = 4 * 1024 * 1024
SEED = 0
PORT = 8700
# the address the project's local cluster (localcluster.network) reaches this machine at
LOCAL_CLUSTER_MACHINE = "10.200.0.1"
MODEL_YAML = """\
# The README's first model: a {size} demo model on the cpu backend.
# `resident bundle serve-demo` generates this bundle, serves it at the source below and
# prints this file (its digest is the bundle's; the generator is deterministic).
apiVersion: resident.dev/v1alpha1
kind: ResidentModel
metadata:
  name: {name}
spec:
  accelerator: cpu
  replicas: 1
  bundle:
    source: {source}
    digest: {digest}
  delivery:
    mode: Auto
    minReuse: 0.5
  runtime:
    backend: cpu
    port: 8080
  transition:
    strategy: Auto
"""


def model_yaml(name: str, source: str, digest: str, size: int = SIZE) -> str:
    """The ResidentModel that keeps the demo bundle ``digest`` at ``source`` resident."""
    return MODEL_YAML.format(name=name, source=source, digest=digest, size=_size_text(size))


def _size_text(size: int) -> str:
    return f"{size // 2**20} MiB" if size % 2**20 == 0 else f"{size} B"


def source_url(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/models/{name}"


def generate(work: Path, name: str, size: int, seed: int) -> Path:
    """The demo bundle in ``work/name``, generated unless an earlier run left it there."""
    bundle = work / name
    if not (bundle / MANIFEST_NAME).exists():
        cpu_model.make_demo(bundle, size, seed)
    return bundle


def add_arguments(sp: argparse.ArgumentParser, size_type=int) -> None:
    sp.add_argument("--name", default=NAME, help=f"model name (default {NAME})")
    sp.add_argument("--size", type=size_type, default=SIZE, help="weights size (default 4MiB)")
    sp.add_argument("--seed", type=int, default=SEED, help="generator seed (default 0)")
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sp.add_argument("--port", type=int, default=PORT, help=f"TCP port (default {PORT}; 0 picks one)")
    sp.add_argument("--url", default="", help="base URL the cluster reaches this server at (default: "
                                              f"http://{LOCAL_CLUSTER_MACHINE}:PORT, where the project's local "
                                              "cluster reaches this machine's 127.0.0.1:PORT)")
    sp.add_argument("--dir", default="", help="keep the bundle and the served files here "
                                              "(default: a temporary directory, removed on exit)")


def _publish(args: argparse.Namespace, work: Path, port: int) -> None:
    """Generate the bundle, push it to our own server, print the ResidentModel."""
    bundle = generate(work, args.name, args.size, args.seed)
    push(bundle, source_url(f"http://127.0.0.1:{port}", args.name))
    base = args.url or f"http://{LOCAL_CLUSTER_MACHINE}:{port}"
    print(model_yaml(args.name, source_url(base, args.name), read_manifest(bundle).digest,
                     args.size), flush=True)
    print(f"# serving {source_url(base, args.name)} from {work}; Ctrl-C stops it",
          file=sys.stderr, flush=True)


def serve_demo(args: argparse.Namespace) -> int:
    if not args.url and args.host in ("0.0.0.0", "::", ""):
        print(f"resident bundle serve-demo: error: with --host {args.host!r} give --url, the address "
              "the cluster reaches this machine at", file=sys.stderr)
        return 2
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="resident-demo-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with BundleServer(work / "served", args.host, args.port) as server:   # binds first
            thread = threading.Thread(target=server.serve_forever, name="bundle-server", daemon=True)
            thread.start()
            try:
                _publish(args, work, server.server_address[1])
                while not stop.wait(1.0):
                    pass
            except KeyboardInterrupt:
                pass
            finally:
                server.shutdown()
                thread.join(10)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0
