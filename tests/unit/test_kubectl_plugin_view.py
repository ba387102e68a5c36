"""``kubectl resident``'s rendering, from status as the operator's own builders write it,
and how it tells its errors apart.

The transition in flight and the last transition come from ``TransitionState.dump()`` and
``transition_summary.summarize()``, so a change of the status shape fails here first."""

from __future__ import annotations

import ast
from pathlib import Path

import kubectl_resident
from kubectl_resident import view
from resident_operator.transition import Bytes, OwnerProgress, Step, TransitionState
from resident_operator.transition_summary import summarize

OLD, NEW = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
NOW = 1_800_000_000.0


def transition(result: str = "running", **extra) -> TransitionState:
    return TransitionState(
        id="t-7", **{"from": OLD}, to=NEW, toSource="file:///srv/b", strategy="InPlace", path="GraphOnly",
        method="graph-swap", predicted={"fetched": 3 * 2**20, "reused": 5 * 2**30}, generation=3,
        startedAt=NOW - 42, result=result, owners=[
            OwnerProgress(slot=0, pod="llm-owner-0-1", podUID="u0", node="node-a", step=Step.done,
                          bytes=Bytes(fetched=3 * 2**20, reused=5 * 2**30, written=3 * 2**20, peers=2 * 2**20),
                          startedAt=NOW - 40, deliveredAt=NOW - 30, appliedAt=NOW - 25, finishedAt=NOW - 20,
                          strategy="InPlace", method="graph-swap", firstTokenSeconds=0.8,
                          stagingSeconds=9.5, ownerSeconds=4.0),
            OwnerProgress(slot=1, pod="llm-owner-1-1", podUID="u1", node="node-b", step=Step.applying,
                          bytes=Bytes(fetched=2**20), startedAt=NOW - 10)], **extra)


def model(status: dict) -> dict:
    return {"metadata": {"name": "llm", "namespace": "models", "uid": "m-uid"},
            "spec": {"replicas": 2, "bundle": {"digest": NEW, "source": "file:///srv/b"}},
            "status": status}


OWNERS = [
    {"pod": "llm-owner-1-1", "uid": "u1", "slot": 1, "ready": False, "phase": "Running", "node": "node-b",
     "state": "transitioning", "identity": {"bundle": OLD}},
    {"pod": "llm-owner-0-1", "uid": "u0", "slot": 0, "ready": True, "phase": "Running", "node": "node-a",
     "state": "ready", "identity": {"bundle": NEW, "graph": "sha256:" + "c3" * 32, "weights": "sha256:" + "d4" * 32}},
]
CONDITIONS = [{"type": "Transitioning", "status": "True", "reason": "TransitionInProgress",
               "message": "1/2 owners on the target", "lastTransitionTime": "2027-01-15T07:59:20Z"}]


def test_get_shows_each_owner_with_its_node_revision_and_step():
    status = {"phase": "Transitioning", "ready": "1/2", "bundle": {"digest": OLD}, "owners": OWNERS,
              "conditions": CONDITIONS, "transition": transition().dump()}
    text = "\n".join(view.render_model(model(status), NOW))
    lines = text.splitlines()
    row0 = next(line for line in lines if line.strip().startswith("llm-owner-0-1"))
    row1 = next(line for line in lines if line.strip().startswith("llm-owner-1-1"))
    assert row0.split()[:7] == ["llm-owner-0-1", "0", "node-a", "yes", "ready", NEW[:19], "Done"]
    assert row1.split()[:7] == ["llm-owner-1-1", "1", "node-b", "no", "transitioning", OLD[:19], "Applying"]
    assert "3.0 MiB / 5.0 GiB / 3.0 MiB" in row0
    assert lines.index(row0) < lines.index(row1)   # by slot
    assert f"{OLD[:19]} -> {NEW[:19]}  strategy InPlace, path GraphOnly, method graph-swap, running for 42.0s" in text
    assert "Transitioning  True    TransitionInProgress  40s  1/2 owners on the target" in text
    assert "Phase:       Transitioning" in text and "Ready:       1/2 (replicas 2)" in text


def test_get_shows_an_owner_of_the_transition_whose_pod_is_gone():
    t = transition()
    t.owners[1] = t.owners[1].model_copy(update={"step": Step.replacing, "reason": "OwnerReplaced"})
    live = [o for o in OWNERS if o["pod"] == "llm-owner-0-1"]
    text = "\n".join(view.render_model(model({"owners": live, "transition": t.dump()}), NOW))
    gone = next(line for line in text.splitlines() if line.strip().startswith("llm-owner-1-1"))
    assert gone.split()[:7] == ["llm-owner-1-1", "1", "node-b", "no", "gone", "-", "Replacing"]
    assert gone.endswith("OwnerReplaced")


def test_get_of_a_new_model_says_none_yet():
    text = "\n".join(view.render_model(model({}), NOW))
    assert "Phase:       Unknown" in text and text.count("(none yet)") == 2


def test_history_shows_the_last_transition_bytes_durations_and_nodes():
    last = summarize(transition("succeeded"), NOW)
    events = [{"reason": "TransitionSucceeded", "message": "all 2 owners are on x in 42.0s",
               "time": "2027-01-15T08:00:00Z", "count": 1},
              {"reason": "TransitionPlanned", "message": "transition a -> b: GraphOnly", "time":
               "2027-01-15T07:59:18Z", "count": 1},
              {"reason": "OwnerPodCreated", "message": "not a transition", "time": "2027-01-15T07:00:00Z"}]
    text = "\n".join(view.render_history(model({"lastTransition": last}), events, NOW))
    assert "t-7  succeeded  " + OLD[:19] in text and "InPlace   GraphOnly  graph-swap  2" in text
    assert "actual     4.0 MiB  2.0 MiB     5.0 GiB  3.0 MiB" in text   # fetched, of which from peers
    assert "predicted  3.0 MiB  -           5.0 GiB" in text
    assert "10.0s    5.0s   0.8s" in text and "42.0s" in text   # deliver, apply, first token, total
    assert "node-a  1       3.0 MiB  2.0 MiB" in text and "node-b  1       1.0 MiB  0 B" in text
    reasons = [line.split()[1] for line in text.splitlines()[text.splitlines().index(
        "Transition Events (kept by the API server for its --event-ttl, 1h by default):") + 2:]]
    assert reasons == ["TransitionPlanned", "TransitionSucceeded"]   # oldest first, others left out


def test_get_shows_the_staged_and_the_kept_revision_and_history_the_commit_skew():
    third = "sha256:" + "c3" * 32
    m = model({"stage": {"digest": third, "ready": "1/2", "nodes": [
                   {"node": "node-a", "state": "Staged"},
                   {"node": "node-b", "state": "Failed", "reason": "IntegrityMismatch"}]},
               "previousBundle": {"digest": OLD, "source": "file:///srv/a"}})
    m["spec"]["stage"] = {"digest": third, "source": "file:///srv/c"}
    text = "\n".join(view.render_model(m, NOW))
    assert f"Staged:      {third[:19]}  on 1/2 owners' nodes; node-b: Failed (IntegrityMismatch)" in text
    assert f"Kept:        {OLD[:19]}" in text
    t = transition("succeeded", commit="Lockstep")
    t.owners = [o.model_copy(update={"step": Step.done, "committed_at": NOW - 20 + 0.01 * o.slot,
                                     "prestaged": True}) for o in t.owners]
    text = "\n".join(view.render_history(model({"lastTransition": summarize(t, NOW)}), [], NOW))
    assert "commit Lockstep, skew 10 ms (first to last owner's commit), pre-staged" in text


def test_history_of_a_failed_transition_names_reason_and_owner():
    t = transition("failed", reason="Timeout", message="owner llm-owner-1-1 did not finish step Applying")
    t.owners[1] = t.owners[1].model_copy(update={"step": Step.failed})
    text = "\n".join(view.render_history(model({"lastTransition": summarize(t, NOW)}), [], NOW))
    assert "failed: Timeout: owner llm-owner-1-1 did not finish step Applying (owner llm-owner-1-1)" in text
    assert "(none kept)" in text


def test_sizes_and_durations_read_as_humans_write_them():
    assert [view.size(n) for n in (0, 1023, 1536, 5 * 2**30)] == ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]
    assert [view.seconds(s) for s in (0.25, 75, 3 * 3600 + 60)] == ["0.2s", "1m15s", "3h01m"]


def test_the_operator_never_imports_the_plugin_and_the_view_is_pure():
    operator = Path(__file__).resolve().parents[2] / "operator" / "resident_operator"
    for path in operator.glob("*.py"):
        assert "kubectl_resident" not in path.read_text(), path.name
    tree = ast.parse((Path(kubectl_resident.__file__).parent / "view.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"kubernetes", "urllib3", "kopf", "resident_operator"}


def test_a_missing_model_and_a_missing_crd_are_told_apart():
    import json

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from kubectl_resident import access

    t = access.Target(namespace="models", name="llm", api=client.ApiClient(), context="prod")

    def answer(status: int, body: str) -> str:
        e = ApiException(status=status, reason="x")
        e.body = body
        return str(access._explain(e, t, "get"))

    gone = json.dumps({"kind": "Status", "reason": "NotFound", "details": {"name": "llm", "kind": "residentmodels"}})
    assert answer(404, gone) == "residentmodel 'llm' not found in namespace 'models' (context 'prod')"
    assert answer(404, "404 page not found").startswith("the server has no residentmodels.resident.dev resource")
    assert answer(403, json.dumps({"message": "no"})).startswith(
        "forbidden: you cannot get residentmodels.resident.dev in namespace 'models'")
