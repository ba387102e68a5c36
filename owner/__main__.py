"""``resident owner``: serve one model revision on one card, on two ports.

The owner loads ``<bundle-dir>/current`` with the chosen backend, optionally runs every
compiled variant once (``--warmup``) before ``/readyz`` turns true, and then serves the
control API (``--port``: ``/v1/identity``, ``/v1/transitions``, ``/v1/generate``, behind
the operator's token) and the inference API (``--inference-port``: OpenAI-compatible
``/v1/completions`` and ``/v1/models``, behind ``--api-key-file`` if given), both with
``/healthz``, ``/readyz`` and ``/metrics``. A start failure closes the engine and exits
with status 1 and the cause, which it also writes as ``<Reason>: <message>`` to the
container's termination message (:mod:`owner.termination`) for the operator to read.
On SIGTERM it turns not ready and keeps answering until no inference request came for
``--shutdown-quiet-seconds`` (proxies still send clients here for a moment after the Pod
left its endpoints), at most ``--shutdown-limit-seconds``, then closes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

# One owner, one card: the cpu backend's matrix products run on the request's own thread.
# Left alone, numpy's OpenBLAS starts a worker per core and they spin while they wait, so
# on a busy machine an owner burned about 9 times the CPU per completion (116 ms against
# 13 ms at 4 tokens, 2 cores; docs/owner.md). Set before the backends import numpy; the
# environment may still ask for more.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from bundle import jsonlog
from bundle.stop_signals import StopSignals
from . import termination as term
from .backends import REGISTRY, BackendError, BackendUnavailable, create_backend
from .inference import make_inference_server
from .runtime import Owner, StartupError
from .server import make_server, read_token

log = logging.getLogger("resident.owner")

EPILOG = """\
The bundle dir is the bridge's CSI volume: current -> revisions/sha256-<hex>, each
revision with resident-manifest.json. Transitions name a target digest that must already
be staged under revisions/. The bearer token file is mounted from the model's Secret.
Without --api-key-file the inference port is open to whoever reaches it.

example:
  resident bundle make-demo /tmp/demo --size 4MiB
  resident owner --bundle-dir /srv/bundle --token-file /var/run/resident/token --port 8080
  curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "model", "prompt": "Hello", "max_tokens": 8}'
  resident bundle make-demo /tmp/hf --format hf --size 8MiB     # a Hugging Face checkpoint
  resident owner --backend torch --device cpu --bundle-dir ... --token-file ...
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resident owner",
                                description="Serve one model revision on one card over the owner control API.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle-dir", required=True, help="the bundle volume (holds current and revisions/)")
    p.add_argument("--backend", default="cpu", choices=sorted(REGISTRY),
                   help="runtime backend (default cpu; torch runs Hugging Face checkpoints and needs "
                        "the 'torch' extra; rngd and atom need their vendor SDKs)")
    p.add_argument("--device", help="torch: the device to hold the model on (cpu, cuda, cuda:1; default cpu)")
    p.add_argument("--token-file", required=True, help="file holding the bearer token for /v1/*")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="control port to bind (default 8080; 0 picks one)")
    p.add_argument("--inference-port", type=int, default=8000,
                   help="OpenAI-compatible inference port, on --host too (default 8000; 0 picks one)")
    p.add_argument("--model-name", default="model",
                   help="the model id /v1/models lists and completions echo (default 'model')")
    p.add_argument("--api-key-file", help="file holding the API key the inference port requires as "
                                          "'Authorization: Bearer <key>' (default: no key, the port is open)")
    p.add_argument("--apply-wait-seconds", type=float, default=30.0,
                   help="how long a request may wait behind an in-place apply, or a reload after its "
                        "drain, before it gets 503 (default 30)")
    p.add_argument("--shutdown-quiet-seconds", type=float, default=1.0,
                   help="after SIGTERM, keep serving until no inference request came for this long (or "
                        "for 8 of the usual gaps between requests, up to 6 s, when that is longer), so "
                        "clients still sent here by a proxy that has not seen the Pod leave get answers "
                        "(default 1)")
    p.add_argument("--shutdown-limit-seconds", type=float, default=10.0,
                   help="stop after SIGTERM at the latest this long after it, quiet or not (default 10; "
                        "keep it below the Pod's terminationGracePeriodSeconds)")
    p.add_argument("--warmup", action="store_true", help="run every variant once before /readyz is true")
    p.add_argument("--verify-chunks", action="store_true",
                   help="cpu, torch: after an in-place write also rebuild every changed chunk from live memory "
                        "and check it against the manifest (catches stray writes; costs a hash per chunk)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines on stderr)")
    p.add_argument("--termination-log", type=Path, default=term.TERMINATION_LOG,
                   help="where a start failure writes '<Reason>: <message>' for Kubernetes to keep "
                        "(default /dev/termination-log; written only if the file exists)")
    return p.parse_args(argv)


def start_failed(args: argparse.Namespace, reason: str, message: str) -> int:
    """Say why the owner cannot start (stderr, the log, the termination message); exit 1."""
    print(f"resident owner: start failed: {reason}: {message}", file=sys.stderr)
    term.record_start_failure(reason, message, args.termination_log)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    jsonlog.configure(args.log_level)
    # First of all: in a container the owner is PID 1, and PID 1 ignores a signal it has no
    # handler for, so a SIGTERM that came while the backend loads (torch imports for seconds)
    # was lost and kubelet waited out the grace period before its SIGKILL.
    stop = StopSignals()
    log.info("owner starting", extra={"backend": args.backend, "bundle_dir": args.bundle_dir})
    if args.verify_chunks and args.backend not in ("cpu", "torch"):
        print("resident owner: --verify-chunks applies to the cpu and torch backends only", file=sys.stderr)
        return 2
    if args.device and args.backend != "torch":
        print("resident owner: --device applies to the torch backend only", file=sys.stderr)
        return 2
    options = {"verify_chunks": True} if args.verify_chunks else {}
    if args.device:
        options["device"] = args.device
    try:
        token = read_token(args.token_file)
        api_key = read_token(args.api_key_file) if args.api_key_file else None
    except (OSError, ValueError) as e:
        return start_failed(args, term.CREDENTIALS_UNREADABLE, str(e))
    try:
        backend = create_backend(args.backend, **options)
    except BackendUnavailable as e:
        return start_failed(args, term.BACKEND_UNAVAILABLE, str(e))
    except BackendError as e:
        return start_failed(args, term.BACKEND_FAILED, str(e))
    if stop.is_set():
        log.info("owner stopped before it served: a signal came while the backend loaded")
        return 0
    if args.apply_wait_seconds < 0:
        print("resident owner: --apply-wait-seconds must be >= 0", file=sys.stderr)
        return 2
    owner = Owner(args.bundle_dir, backend, warmup=args.warmup, apply_wait_seconds=args.apply_wait_seconds)
    servers = []
    try:
        servers.append(make_server(owner, token, args.host, args.port))
        servers.append(make_inference_server(owner, args.host, args.inference_port, args.model_name, api_key))
    except OSError as e:
        port = args.inference_port if servers else args.port
        for server in servers:
            server.server_close()
        return start_failed(args, term.PORT_UNAVAILABLE, f"cannot bind {args.host}:{port}: {e}")
    for name, server in zip(("control", "inference"), servers):
        threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    log.info("owner listening", extra={"host": args.host, "port": servers[0].server_address[1],
                                       "inference_port": servers[1].server_address[1],
                                       "model_name": args.model_name, "api_key": api_key is not None,
                                       "backend": args.backend, "bundle_dir": args.bundle_dir})
    code = 0
    try:
        owner.start()
        stop.wait()
        owner.terminating = True   # /readyz says no from now on
        waited = owner.drain_for_shutdown(args.shutdown_quiet_seconds, args.shutdown_limit_seconds)
        log.info("owner stopping", extra={"drained_seconds": round(waited, 3)})
    except StartupError as e:
        code = start_failed(args, term.LOAD_FAILED, str(e))
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        owner.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
