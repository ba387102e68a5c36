"""The command line of ``kubectl resident``: arguments, output and exit codes.

Exit codes: 0 done (also when ``--watch`` ends with Ctrl-C), 1 the model could not be
read (not found, forbidden, no API server, no kubeconfig: the message says which), 2 the
arguments are wrong.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import access, view

DESCRIPTION = """\
Show ResidentModels: their owners, nodes, revisions, transitions and conditions.

kubectl runs this plugin as `kubectl resident ...` when `kubectl-resident` is on PATH
(the `resident` Python package installs it). It reads the kubeconfig as kubectl does:
--kubeconfig, else $KUBECONFIG, else ~/.kube/config; --context, else the current
context; -n/--namespace, else the context's namespace, else "default". It needs get,
list and watch on residentmodels.resident.dev (and list on events.k8s.io events
for `history`).

exit codes: 0 done (also --watch ended with Ctrl-C), 1 the model could not be read
(not found, forbidden, no API server, no kubeconfig), 2 wrong arguments.
"""

EPILOG = """\
examples:
  kubectl resident get llama -n models          owners, steps and conditions, once
  kubectl resident get llama -n models --watch  redraw on every change, Ctrl-C to stop
  kubectl resident history llama -n models      the last transition and the earlier ones
"""


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="the model's namespace (default: the context's, else default)")
    common.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    common.add_argument("--context", help="kubeconfig context to use (default: the current one)")
    p = argparse.ArgumentParser(prog="kubectl resident", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    get = sub.add_parser("get", parents=[common], help="a live view of a model: owners, nodes, revisions, "
                         "the transition's steps, conditions",
                         description="Show a model's owners (Pod, slot, node, readiness, owner state, "
                         "revision), each owner's step in the transition in flight with the bytes "
                         "moved, the model's conditions and the last transition's result.")
    get.add_argument("model", metavar="MODEL", help="name of the ResidentModel (kubectl short name: rm)")
    get.add_argument("-w", "--watch", action="store_true",
                     help="watch the model and redraw on every change; Ctrl-C exits")
    hist = sub.add_parser("history", parents=[common], help="the model's last transitions: path, strategy, "
                          "bytes, durations",
                          description="Show status.lastTransition in full (path, strategy, method, bytes "
                          "fetched/reused/written, per node, durations) and the earlier transitions as the "
                          "operator's Events tell them (TransitionPlanned, TransitionQueued, "
                          "TransitionSucceeded, TransitionFailed), which the API server keeps for its "
                          "--event-ttl (1h by default). The status keeps only the last transition.")
    hist.add_argument("model", metavar="MODEL", help="name of the ResidentModel")
    return p


def _print(lines: list[str]) -> None:
    print("\n".join(lines), flush=True)


def _get(t: access.Target, watch: bool) -> int:
    model = access.read_model(t)
    _print(view.render_model(model, time.time()))
    if not watch:
        return 0
    redraw = sys.stdout.isatty()
    for kind, model in access.changes(t, model["metadata"]["resourceVersion"]):
        if kind == "DELETED":
            print(f"\nresidentmodel {t.name!r} was deleted", flush=True)
            return 0
        if kind not in ("ADDED", "MODIFIED"):
            continue
        # on a terminal, draw over the last view; into a pipe, append the next one
        print("\x1b[H\x1b[2J" if redraw else f"\n--- {time.strftime('%H:%M:%S')} ---", end="" if redraw else "\n")
        _print(view.render_model(model, time.time()))
    return 0


def _history(t: access.Target) -> int:
    model = access.read_model(t)
    _print(view.render_history(model, access.transition_events(t, model), time.time()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        t = access.connect(args.model, args.namespace, args.kubeconfig, args.context)
        if args.command == "get":
            return _get(t, args.watch)
        return _history(t)
    except access.AccessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def run() -> None:
    """The console script ``kubectl-resident``."""
    sys.exit(main())
