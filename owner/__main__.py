"""``resident owner``: serve one model revision on one card over the owner control API.

The owner loads ``<bundle-dir>/current`` with the chosen backend, optionally runs every
compiled variant once (``--warmup``) before ``/readyz`` turns true, and then serves
``/v1/identity``, ``/v1/transitions``, ``/v1/generate``, ``/healthz``, ``/readyz`` and
``/metrics``. A start failure closes the engine and exits with status 1 and the cause.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from . import jsonlog
from .backends import REGISTRY, BackendError, create_backend
from .runtime import Owner, StartupError
from .server import make_server, read_token

log = logging.getLogger("resident.owner")

EPILOG = """\
The bundle dir is the bridge's CSI volume: current -> revisions/sha256-<hex>, each
revision with resident-manifest.json. Transitions name a target digest that must already
be staged under revisions/. The bearer token file is mounted from the model's Secret.

example:
  resident bundle make-demo /tmp/demo --size 4MiB
  resident owner --bundle-dir /srv/bundle --token-file /var/run/resident/token --port 8080
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
    p.add_argument("--port", type=int, default=8080, help="port to bind (default 8080; 0 picks one)")
    p.add_argument("--warmup", action="store_true", help="run every variant once before /readyz is true")
    p.add_argument("--verify-chunks", action="store_true",
                   help="cpu, torch: after an in-place write also rebuild every changed chunk from live memory "
                        "and check it against the manifest (catches stray writes; costs a hash per chunk)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines on stderr)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    jsonlog.configure(args.log_level)
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
        backend = create_backend(args.backend, **options)
    except (OSError, ValueError, BackendError) as e:
        print(f"resident owner: {e}", file=sys.stderr)
        return 1
    owner = Owner(args.bundle_dir, backend, warmup=args.warmup)
    try:
        server = make_server(owner, token, args.host, args.port)
    except OSError as e:
        print(f"resident owner: cannot bind {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    serving.start()
    log.info("owner listening", extra={"host": args.host, "port": server.server_address[1],
                                       "backend": args.backend, "bundle_dir": args.bundle_dir})
    code = 0
    try:
        owner.start()
        stop.wait()
    except StartupError as e:
        print(f"resident owner: start failed: {e}", file=sys.stderr)
        code = 1
    finally:
        server.shutdown()
        server.server_close()
        owner.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
