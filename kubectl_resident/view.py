"""What a human sees of a ResidentModel: its status dict rendered as compact tables.

Pure: a model (the dict the API server returns), the Events of its transitions and
``now`` (epoch seconds) in, lines of text out. ``status.owners[]`` (what every owner Pod
runs) is joined with ``status.transition.owners[]`` (each owner's step in the transition
in flight) by Pod name, so one row shows an owner's node, revision, state and step.

Only ``status.lastTransition`` holds a finished transition in full (path, strategy,
bytes, durations, per-node bytes); the status keeps no list of earlier ones. Earlier
transitions are told by the operator's Events on the model (TransitionPlanned,
TransitionQueued, TransitionSucceeded, TransitionFailed), for as long as the API server
keeps Events (its ``--event-ttl``, one hour by default).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable

TRANSITION_EVENTS = ("TransitionPlanned", "TransitionQueued", "TransitionSucceeded", "TransitionFailed")
DIGEST_WIDTH = 19   # "sha256:" and 12 hex digits, as the operator's Events print digests


def short(digest: str | None) -> str:
    return (digest or "-")[:DIGEST_WIDTH]


def size(n: int | float | None) -> str:
    """Bytes in IEC units, e.g. ``1.5 MiB``; ``-`` when unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def seconds(s: float | int | None) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 60:
        return f"{s:.1f}s"
    minutes, rest = divmod(int(round(s)), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def age(timestamp: str | None, now: float) -> str:
    """How long ago an RFC 3339 time was (``lastTransitionTime``, an Event's time)."""
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "-"
    s = max(0, int(now - then))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def table(header: list[str], rows: Iterable[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns two spaces apart, the last column unpadded (kubectl's style)."""
    rows = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return [indent + "  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in rows]


def _bytes(b: dict[str, Any] | None) -> str:
    b = b or {}
    return f"{size(b.get('fetched', 0))} / {size(b.get('reused', 0))} / {size(b.get('written', 0))}"


def _owner_rows(status: dict[str, Any]) -> list[list[str]]:
    steps = {p.get("pod"): p for p in (status.get("transition") or {}).get("owners") or []}
    rows, seen = [], set()
    for o in sorted(status.get("owners") or [], key=lambda o: (o.get("slot", 0), o.get("pod", ""))):
        p = steps.get(o.get("pod"), {})
        seen.add(o.get("pod"))
        state = o.get("state") or o.get("phase") or "-"
        note = o.get("reason") or p.get("reason") or ""
        rows.append([o.get("pod", "-"), str(o.get("slot", "-")), o.get("node") or "-",
                     "yes" if o.get("ready") else "no", state,
                     short((o.get("identity") or {}).get("bundle")), p.get("step", "-"),
                     _bytes(p.get("bytes")) if p else "-", note])
    for pod, p in steps.items():   # an owner in the transition whose Pod is gone (being replaced)
        if pod not in seen:
            rows.append([pod, str(p.get("slot", "-")), p.get("node") or "-", "no", "gone", "-",
                         p.get("step", "-"), _bytes(p.get("bytes")), p.get("reason") or ""])
    return rows


def render_model(model: dict[str, Any], now: float) -> list[str]:
    """``kubectl resident get``: the model, its owners with their steps, its conditions."""
    meta, spec, status = model.get("metadata") or {}, model.get("spec") or {}, model.get("status") or {}
    bundle, identity = spec.get("bundle") or {}, status.get("identity") or {}
    lines = [f"Name:        {meta.get('name', '-')}",
             f"Namespace:   {meta.get('namespace', '-')}",
             f"Phase:       {status.get('phase') or 'Unknown'}",
             f"Ready:       {status.get('ready') or '-'} (replicas {spec.get('replicas', '-')})",
             f"Wanted:      {short(bundle.get('digest'))}  {bundle.get('source', '')}".rstrip(),
             f"Running:     {short((status.get('bundle') or {}).get('digest'))}"
             + (f"  identity bundle {short(identity.get('bundle'))}, graph {short(identity.get('graph'))},"
                f" weights {short(identity.get('weights'))}" if identity else "  (owners disagree or none ready)"),
             f"Endpoint:    {status.get('endpoint') or '-'}"]
    stage, previous = status.get("stage") or {}, status.get("previousBundle") or {}
    if (spec.get("stage") or {}).get("digest"):
        lines.append(f"Staged:      {short(spec['stage']['digest'])}  on {stage.get('ready') or '0/?'} owners' nodes"
                     + "".join(f"; {n.get('node')}: {n.get('state')}" + (f" ({n['reason']})" if n.get("reason") else "")
                               for n in stage.get("nodes") or [] if n.get("state") != "Staged"))
    if previous.get("digest"):
        lines.append(f"Kept:        {short(previous['digest'])}  (the revision left at the last switch, "
                     "staged for a rollback)")
    t = status.get("transition")
    if t:
        lines += ["", f"Transition:  {short(t.get('from'))} -> {short(t.get('to'))}  "
                      f"strategy {t.get('strategy', '-')}, path {t.get('path', '-')}"
                      + (f", method {t['method']}" if t.get("method") else "")
                      + f", running for {seconds(max(0.0, now - float(t.get('startedAt') or now)))}"]
        predicted = t.get("predicted") or {}
        if predicted:
            lines.append("  predicted: " + ", ".join(f"{k} {size(v) if isinstance(v, (int, float)) else v}"
                                                     for k, v in sorted(predicted.items())))
    pending = status.get("pendingTransition")
    if pending:
        lines.append(f"Queued:      {short(pending.get('to') or pending.get('digest'))} (after the transition in flight)")
    lines += ["", "Owners:"]
    rows = _owner_rows(status)
    if rows:
        lines += table(["POD", "SLOT", "NODE", "READY", "STATE", "REVISION", "STEP",
                        "FETCHED / REUSED / WRITTEN", "REASON"], rows)
    else:
        lines.append("  (none yet)")
    conds = status.get("conditions") or []
    lines += ["", "Conditions:"]
    if conds:
        lines += table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
                       [[c.get("type", ""), c.get("status", ""), c.get("reason", ""),
                         age(c.get("lastTransitionTime"), now), c.get("message", "")] for c in conds])
    else:
        lines.append("  (none yet)")
    last = status.get("lastTransition")
    if last:
        lines += ["", f"Last transition: {last.get('result') or '-'}  {short(last.get('from'))} -> "
                      f"{short(last.get('to'))} in {seconds((last.get('durations') or {}).get('totalSeconds'))}"
                      f"  (kubectl resident history {meta.get('name', 'MODEL')})"]
    return lines


def render_history(model: dict[str, Any], events: list[dict[str, Any]], now: float) -> list[str]:
    """``kubectl resident history``: the last transition in full, then the earlier ones as
    the Events on the model tell them (``{reason, message, count, time}``, newest last)."""
    meta, status = model.get("metadata") or {}, model.get("status") or {}
    lines = [f"Model {meta.get('namespace', '-')}/{meta.get('name', '-')}", ""]
    t = status.get("transition")
    if t:
        lines += [f"In flight:  {short(t.get('from'))} -> {short(t.get('to'))}  strategy {t.get('strategy', '-')}, "
                  f"path {t.get('path', '-')}, running for "
                  f"{seconds(max(0.0, now - float(t.get('startedAt') or now)))}", ""]
    last = status.get("lastTransition")
    lines.append("Last transition (status.lastTransition):")
    if not last:
        lines.append("  (none: the model has not finished a transition)")
    else:
        d, b, p = last.get("durations") or {}, last.get("bytes") or {}, last.get("predicted") or {}
        lines += table(["ID", "RESULT", "FROM", "TO", "STRATEGY", "PATH", "METHOD", "OWNERS", "REPLACED"],
                       [[last.get("id") or "-", last.get("result") or "-", short(last.get("from")),
                         short(last.get("to")), last.get("strategy") or "-", last.get("path") or "-",
                         last.get("method") or "-", str(last.get("owners", "-")), str(last.get("replaced", "-"))]])
        lines += [""] + table(["BYTES", "FETCHED", "FROM PEERS", "REUSED", "WRITTEN"],
                              [["actual", size(b.get("fetched")), size(b.get("peers")), size(b.get("reused")),
                                size(b.get("written"))]]
                              + ([["predicted", size(p.get("fetched")), "-", size(p.get("reused")),
                                   size(p.get("written"))]] if p else []))
        skew = float(last.get("skewSeconds") or 0.0)
        lines += ["", f"  commit {last.get('commit') or 'Rolling'}, skew "
                      f"{f'{skew * 1000:.0f} ms' if skew < 1 else seconds(skew)}"
                      f" (first to last owner's commit)"
                      + (", pre-staged: no delivery in the switch" if last.get("prestaged") else "")]
        lines += [""] + table(["DELIVER", "APPLY", "FIRST TOKEN", "STAGING", "OWNER", "OVERHEAD", "TOTAL"],
                              [[seconds(d.get(k)) for k in ("deliverSeconds", "applySeconds", "firstTokenSeconds",
                                                            "stagingSeconds", "ownerSeconds", "overheadSeconds",
                                                            "totalSeconds")]])
        nodes = last.get("nodes") or []
        if nodes:
            lines += [""] + table(["NODE", "OWNERS", "FETCHED", "FROM PEERS", "REUSED", "WRITTEN"],
                                  [[n.get("node", "-"), str(n.get("owners", "-")), size(n.get("fetched")),
                                    size(n.get("peers")), size(n.get("reused")), size(n.get("written"))]
                                   for n in nodes])
        if last.get("result") == "failed":
            lines += ["", f"  failed: {last.get('reason') or '-'}: {last.get('message') or ''}"
                          + (f" (owner {last['failedOwner']})" if last.get("failedOwner") else "")]
    lines += ["", "Transition Events (kept by the API server for its --event-ttl, 1h by default):"]
    rows = [[age(e.get("time"), now), e.get("reason", ""), str(e.get("count") or 1), e.get("message", "")]
            for e in sorted((e for e in events if e.get("reason") in TRANSITION_EVENTS),
                            key=lambda e: e.get("time") or "")]
    lines += table(["AGE", "REASON", "COUNT", "MESSAGE"], rows) if rows else ["  (none kept)"]
    return lines

