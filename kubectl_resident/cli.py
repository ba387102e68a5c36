"""The command line of ``kubectl resident``: arguments, output and exit codes.

Exit codes: 0 done (also when ``--watch`` ends with Ctrl-C), 1 the model could not be
read or changed, or a ``--wait`` ended without getting there (the message says why),
2 the arguments are wrong.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import access, change, view

DESCRIPTION = """\
Show ResidentModels (their owners, nodes, revisions, transitions and conditions), stage
their next revision, switch to it and roll back.

kubectl runs this plugin as `kubectl resident ...` when `kubectl-resident` is on PATH
(the `resident` Python package installs it). It reads the kubeconfig as kubectl does:
--kubeconfig, else $KUBECONFIG, else ~/.kube/config; --context, else the current
context; -n/--namespace, else the context's namespace, else "default". It needs get,
list and watch on residentmodels.resident.dev (and list on events.k8s.io events
for `history`; patch for `stage`, `switch` and `rollback`).

exit codes: 0 done (also --watch ended with Ctrl-C), 1 the model could not be read or
changed (not found, forbidden, no API server, no kubeconfig, refused, changed by someone
else meanwhile), or --wait ended without getting there (failed, timed out), 2 wrong
arguments.
"""

EPILOG = """\
examples:
  kubectl resident get llama -n models          owners, steps and conditions, once
  kubectl resident get llama -n models --watch  redraw on every change, Ctrl-C to stop
  kubectl resident history llama -n models      the last transition and the earlier ones
  kubectl resident stage llama --source oci://registry/llama:v2 --digest sha256:... --wait
  kubectl resident switch llama --commit Lockstep --wait   to the staged revision, all at once
  kubectl resident rollback llama --wait                   back to the revision kept staged
"""

WAIT_SECONDS = 900


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

    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--wait", action="store_true",
                         help="follow the change with a progress bar until every owner got there; exit 1 "
                         "if it fails or --timeout passes (the change stays: the operator goes on)")
    waiting.add_argument("--timeout", type=float, default=WAIT_SECONDS, metavar="SECONDS",
                         help=f"how long --wait waits (default {WAIT_SECONDS})")
    committing = argparse.ArgumentParser(add_help=False)
    committing.add_argument("--commit", choices=["Rolling", "Lockstep"],
                            help="also set spec.transition.commit: Lockstep prepares every owner, then "
                            "commits all at one barrier, or none if one cannot prepare (it stays set "
                            "for later switches)")
    stage = sub.add_parser("stage", parents=[common, waiting], help="stage the next revision on every "
                           "owner's node while the live one serves (spec.stage)",
                           description="Set spec.stage: the bridge on every node that runs an owner "
                           "stages the revision beside the live one, so a later switch to it moves no "
                           "byte. --clear removes spec.stage and releases it.")
    stage.add_argument("model", metavar="MODEL", help="name of the ResidentModel")
    stage.add_argument("--source", help="where the revision comes from (as in spec.bundle.source)")
    stage.add_argument("--digest", help="its bundle digest, sha256:<64 hex>")
    stage.add_argument("--preload", action="store_true",
                       help="each owner also loads it beside the live revision, so a switch to it that "
                            "reloads is a swap (memory for two revisions while staged); --wait then waits "
                            "for the preloads too")
    stage.add_argument("--clear", action="store_true", help="remove spec.stage instead")
    switch = sub.add_parser("switch", parents=[common, waiting, committing],
                            help="switch to the staged revision (or to --source/--digest)",
                            description="Set spec.bundle to the revision in spec.stage, or to the one "
                            "given. A revision staged on every owner's node switches without delivery.")
    switch.add_argument("model", metavar="MODEL", help="name of the ResidentModel")
    switch.add_argument("--source", help="switch to this source instead of the staged revision")
    switch.add_argument("--digest", help="with --source: the revision's bundle digest")
    rollback = sub.add_parser("rollback", parents=[common, waiting, committing],
                              help="switch back to the revision before",
                              description="Set spec.bundle back: to the committed revision while a "
                              "switch is pending or in flight, else to the revision the owners left at "
                              "the last switch (status.previousBundle, kept staged while "
                              "spec.transition.keepPrevious is on, the default).")
    rollback.add_argument("model", metavar="MODEL", help="name of the ResidentModel")
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


def _given(p: argparse.ArgumentParser, args: argparse.Namespace) -> change.Revision | None:
    if bool(args.source) != bool(args.digest):
        p.error("--source and --digest go together")
    return change.Revision(args.source, args.digest) if args.digest else None


def _wait(t: access.Target, model: dict, measure, what: str, timeout: float) -> change.Progress:
    """Follow the model with a progress bar (owners got there, of all) until ``measure``
    says the change ended or ``timeout`` passes."""
    from tqdm import tqdm
    progress = measure(model)
    with tqdm(total=progress.total or None, desc=what, unit="owner", file=sys.stderr,
              dynamic_ncols=True) as bar:
        def show(p: change.Progress) -> None:
            bar.total, bar.n = p.total or None, p.done
            bar.refresh()
        show(progress)
        if not progress.finished:
            for kind, model in access.changes(t, model["metadata"]["resourceVersion"],
                                              until=time.monotonic() + timeout):
                if kind == "DELETED":
                    return change.Progress(0, 0, True, f"residentmodel {t.name!r} was deleted")
                progress = measure(model)
                show(progress)
                if progress.finished:
                    break
    if not progress.finished:
        return change.Progress(progress.done, progress.total, False,
                               f"not there after {timeout:g}s ({progress.done}/{progress.total} owners); the "
                               f"change stays and the operator goes on: kubectl resident get {t.name}")
    return progress


def _outcome(t: access.Target, progress: change.Progress, done: str) -> int:
    if progress.failure:
        print(f"error: {progress.failure}", file=sys.stderr)
        return 1
    print(f"residentmodel {t.name!r}: {done}", flush=True)
    return 0


def _stage(p: argparse.ArgumentParser, t: access.Target, args: argparse.Namespace) -> int:
    target = _given(p, args)
    if (target is None) == (not args.clear):
        p.error("give --source and --digest, or --clear")
    model = access.patch_model(t, change.stage_patch(access.read_model(t), target, args.preload))
    if target is None:
        print(f"residentmodel {t.name!r}: spec.stage removed; its revision is released", flush=True)
        return 0
    if not args.wait:
        print(f"residentmodel {t.name!r}: staging {view.short(target.digest)} (follow: kubectl resident get "
              f"{t.name} --watch)", flush=True)
        return 0
    got = _wait(t, model, lambda m: change.staging_progress(m, target.digest, args.preload),
                f"staging {view.short(target.digest)}", args.timeout)
    return _outcome(t, got, f"{view.short(target.digest)} staged on {got.done}/{got.total} owners' nodes"
                            + (" and preloaded (kubectl resident get shows any owner that could not)"
                               if args.preload else ""))


def _switch(p: argparse.ArgumentParser, t: access.Target, args: argparse.Namespace) -> int:
    model = access.read_model(t)
    if args.command == "rollback":
        target = change.rollback_target(model)
    else:
        target = change.switch_target(model, _given(p, args))
    if change.already_on(model, target):
        print(f"residentmodel {t.name!r}: already on {view.short(target.digest)}", flush=True)
        return 0
    note = change.delivery_note(model, target)
    before = ((model.get("status") or {}).get("lastTransition") or {}).get("id")
    model = access.patch_model(t, change.switch_patch(model, target, args.commit))
    if note:   # said once the switch is written, not for one that was refused
        print(f"note: {note}", file=sys.stderr)
    verb = "rolling back" if args.command == "rollback" else "switching"
    if not args.wait:
        print(f"residentmodel {t.name!r}: {verb} to {view.short(target.digest)} (follow: kubectl resident get "
              f"{t.name} --watch)", flush=True)
        return 0
    got = _wait(t, model, lambda m: change.switch_progress(m, target.digest, before),
                f"{verb} to {view.short(target.digest)}", args.timeout)
    return _outcome(t, got, f"on {view.short(target.digest)} ({got.done}/{got.total} owners)")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        t = access.connect(args.model, args.namespace, args.kubeconfig, args.context)
        if args.command == "get":
            return _get(t, args.watch)
        if args.command == "history":
            return _history(t)
        if args.command == "stage":
            return _stage(p, t, args)
        return _switch(p, t, args)
    except (access.AccessError, change.Refused) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def run() -> None:
    """The console script ``kubectl-resident``."""
    sys.exit(main())
