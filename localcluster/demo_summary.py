"""The demo's last word: what the run proved, in a few lines a reader can check.

The demo collects facts as it goes (:class:`DemoFacts`: how long the model took to become
Ready, which revision answered through the Service, each transition's status record,
whether the owner Pod survived the switches, what deletion left behind, the teardown).
:func:`summary` turns them into the transitions table and one line per claim. Pure, so a
unit test pins the wording; every number comes from the model's status or the demo's
own clock, never from a constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .progress import duration
from .scenario import format_table, transition_row


@dataclass
class DemoFacts:
    model: str                                  # namespace/name
    backend: str
    size_mib: int
    ready_seconds: float = 0.0                  # apply -> Ready on revision A
    answers: list[tuple[str, str]] = field(default_factory=list)   # (revision letter, answering digest)
    transitions: list[tuple[str, dict]] = field(default_factory=list)  # (label, status.lastTransition)
    owner_pods: list[str] = field(default_factory=list)   # owner Pod UIDs seen before and after the switches
    leftovers: dict[str, list] = field(default_factory=dict)
    picture: Path | None = None                 # the switches drawn (demo_picture)
    teardown_seconds: float | None = None
    total_seconds: float = 0.0


def _mib(n: int | None) -> str:
    return f"{(n or 0) / 2**20:.1f} MiB"


def transition_line(label: str, last: dict) -> str:
    """``C->D rebase: whole bundle (rebase), reloaded, 2.31s (fetched 0.3 MiB, reused 63.7 MiB)``."""
    b, d = last.get("bytes") or {}, last.get("durations") or {}
    strategy = {"InPlace": "in place", "Reload": "reloaded"}.get(str(last.get("strategy")), str(last.get("strategy")))
    path = "graph-only" if last.get("path") == "GraphOnly" else f"whole bundle ({last.get('method')})"
    return (f"{label}: {path}, {strategy}, {d.get('totalSeconds') or 0:.2f}s "
            f"(fetched {_mib(b.get('fetched'))}, reused {_mib(b.get('reused'))})")


NODE_HEADER = ["transition", "node", "owners", "fetched MiB", "reused MiB", "written MiB"]


def node_table(transitions: list[tuple[str, dict]]) -> str:
    """What each node's bridge moved in each transition (``lastTransition.nodes``)."""
    mib = lambda n: f"{(n or 0) / 2**20:.1f}"
    rows = [[label, n["node"], str(n.get("owners", "")), mib(n.get("fetched")), mib(n.get("reused")),
             mib(n.get("written"))] for label, last in transitions for n in last.get("nodes") or []]
    return format_table(rows, NODE_HEADER)


def summary(facts: DemoFacts) -> str:
    """The transitions table (and, on several nodes, what each node moved) and 3-6 lines of
    what this run showed."""
    lines = [format_table([transition_row(label, last) for label, last in facts.transitions]), ""]
    if any(len(last.get("nodes") or []) > 1 for _, last in facts.transitions):
        lines += [node_table(facts.transitions), ""]
    claims = [f"{facts.model} ({facts.size_mib} MiB, {facts.backend} backend) went from apply to Ready "
              f"in {duration(facts.ready_seconds)}, installed by the Helm chart on a real kubelet node"]
    if facts.answers:
        answered = ", ".join(f"{letter} ({digest[:15]})" for letter, digest in facts.answers)
        claims.append(f"OpenAI completions through its Service were answered by the live revision: {answered}")
    same_pod = len(set(facts.owner_pods)) == 1 and len(facts.owner_pods) > 1
    claims.append(f"{len(facts.transitions)} revision switches{', all in the same owner Pod' if same_pod else ''}:"
                  + "".join(f"\n      {transition_line(label, last)}" for label, last in facts.transitions))
    if facts.picture:
        claims.append(f"where each switch's time went (bridge, owner, operator), drawn: {facts.picture}")
    left = {what: items for what, items in facts.leftovers.items() if items}
    kinds = ", ".join(facts.leftovers) or "nothing checked"
    claims.append(f"deleting the model left nothing behind (checked: {kinds})" if not left
                  else f"deleting the model LEFT {left}")
    if facts.teardown_seconds is not None:
        claims.append(f"every process stopped and the machine restored in {duration(facts.teardown_seconds)}; "
                      f"the whole run took {duration(facts.total_seconds)}")
    lines += [f"  - {claim}" for claim in claims]
    return "\n".join(lines)
