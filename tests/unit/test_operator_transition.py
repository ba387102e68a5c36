"""The transition state machine: every step, every failure path, maxUnavailable."""

import pytest

from resident_operator.delivery import DeliveryObservation
from resident_operator.transition import (ACTIVE_STEPS, Action, Bytes, OwnerObservation, OwnerProgress, Step,
                                          TransitionState, advance, outcome, owners_to_start,
                                          step_deadline)
from resident_operator.transition_summary import summarize

A = "sha256:" + "aa" * 32
B = "sha256:" + "bb" * 32


def state(n=1):
    return TransitionState(id="t1", **{"from": A}, to=B, toSource="file:///b", strategy="InPlace",
                           path="GraphOnly", startedAt=100.0,
                           owners=[OwnerProgress(slot=i, pod=f"m-owner-{i}", podUID=f"u{i}")
                                   for i in range(n)])


def healthy(**kw):
    base = dict(pod_exists=True, pod_uid="u0", node="n1", running=True, ready=True, state="ready",
                identity_bundle=A)
    base.update(kw)
    return OwnerObservation(**base)


def step(t, p, obs, now=101.0, timeout=600):
    return advance(t, p, obs, now=now, timeout_seconds=timeout)


def test_happy_path_walks_every_step():
    t = state()
    p = t.owners[0]
    d = step(t, p, healthy())
    assert d.progress.step == Step.delivering and d.actions == [Action.create_delivery]
    p = d.progress.model_copy(update={"delivery": "bd"})
    assert step(t, p, healthy(delivery=DeliveryObservation(phase="Staging"))).progress.step == Step.delivering
    d = step(t, p, healthy(delivery=DeliveryObservation(phase="Staged", verified=True, fetched=10,
                                                        reused=90, written=10, method="graph-only")))
    assert d.progress.step == Step.applying and d.actions == [Action.start_owner_transition]
    assert d.progress.bytes.reused == 90 and d.progress.method == "graph-only"
    p = d.progress.model_copy(update={"owner_transition": "ot1"})
    assert step(t, p, healthy(state="transitioning", owner_transition={"result": "running"})).progress.step == Step.applying
    d = step(t, p, healthy(owner_transition={"result": "succeeded", "strategy": "InPlace",
                                             "timings": {"firstTokenSeconds": 0.2}}))
    assert d.progress.step == Step.verifying and d.progress.first_token_seconds == 0.2
    d = step(t, d.progress, healthy(identity_bundle=B))
    assert d.progress.step == Step.releasing and d.actions == [Action.release_old_deliveries]
    d = step(t, d.progress, healthy(identity_bundle=B))
    assert d.progress.step == Step.done
    t.owners[0] = d.progress
    assert outcome(t) == "succeeded"


@pytest.mark.parametrize("obs_kw, reason", [
    ({"delivery": DeliveryObservation(phase="Failed", reason="IntegrityMismatch")}, "DeliveryFailed"),
])
def test_failed_delivery_fails_the_owner_and_releases_the_target(obs_kw, reason):
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.delivering, "delivery": "bd", "started_at": 100.0})
    d = step(t, p, healthy(**obs_kw))
    assert d.progress.step == Step.failed and d.progress.reason == reason
    assert "IntegrityMismatch" in d.progress.message
    assert d.actions == [Action.release_target_delivery]


def applying(t):
    return t.owners[0].model_copy(update={"step": Step.applying, "owner_transition": "ot1",
                                          "started_at": 100.0, "delivered_at": 100.5})


def test_owner_transition_failure_and_needs_reload():
    t = state()
    d = step(t, applying(t), healthy(owner_transition={"result": "failed", "reason": "verify mismatch"}))
    assert d.progress.step == Step.failed and d.progress.reason == "OwnerTransitionFailed"
    assert "verify mismatch" in d.progress.message
    d = step(t, applying(t), healthy(owner_transition={"result": "needs-reload"}))
    assert d.progress.reason == "InPlaceNotPossible"


def test_quarantined_or_unloaded_owner_is_replaced():
    t = state()
    for st in ("quarantined", "unloaded"):
        d = step(t, applying(t), healthy(state=st, owner_transition={"result": "failed"}))
        assert d.progress.step == Step.replacing and d.actions == [Action.replace_owner]
        p = d.progress.model_copy(update={"replaced": True, "pod": "m-owner-0-r1", "pod_uid": "u9"})
        assert step(t, p, healthy(ready=False, state="loading")).progress.step == Step.replacing
        assert step(t, p, healthy(identity_bundle=B)).progress.step == Step.done


def test_not_running_owner_is_replaced_at_start():
    t = state()
    d = step(t, t.owners[0], healthy(running=False, node="", state=None))
    assert d.progress.step == Step.replacing and d.actions == [Action.replace_owner]


def test_identity_mismatch_fails():
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.verifying, "started_at": 100.0})
    d = step(t, p, healthy(identity_bundle=A))
    assert d.progress.step == Step.failed and d.progress.reason == "IdentityMismatch"


def test_with_other_replicas_serving_an_owner_is_done_only_back_in_the_endpoints():
    t = state(2).model_copy(update={"await_endpoints": True})
    p = t.owners[0].model_copy(update={"step": Step.verifying, "started_at": 100.0})
    assert step(t, p, healthy(identity_bundle=B, ready=False)).progress.step == Step.verifying
    assert step(t, p, healthy(identity_bundle=B, ready=True)).progress.step == Step.releasing
    # one replica: nowhere else to send traffic, so the owner's own answer is enough
    alone = state(1)
    p = alone.owners[0].model_copy(update={"step": Step.verifying, "started_at": 100.0})
    assert step(alone, p, healthy(identity_bundle=B, ready=False)).progress.step == Step.releasing


def test_timeout_fails_any_active_step():
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.delivering, "delivery": "bd", "started_at": 100.0})
    d = step(t, p, healthy(delivery=DeliveryObservation(phase="Staging")), now=800.0, timeout=600)
    assert d.progress.step == Step.failed and d.progress.reason == "Timeout"


def test_the_step_deadline_is_the_earliest_running_owners_timeout():
    t = state(3)
    assert step_deadline(None, 600) is None
    assert step_deadline(t, 600) is None            # every owner still waits its turn
    t.owners[0] = t.owners[0].model_copy(update={"step": Step.done, "started_at": 10.0})
    t.owners[1] = t.owners[1].model_copy(update={"step": Step.applying, "started_at": 120.0})
    t.owners[2] = t.owners[2].model_copy(update={"step": Step.delivering, "started_at": 150.0})
    assert step_deadline(t, 600) == 720.0           # the finished owner's start does not count


def test_resume_does_not_post_twice():
    """After a restart in Applying without a recorded id, an owner already on B is not re-asked."""
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.applying, "started_at": 100.0})
    d = step(t, p, healthy(identity_bundle=B))
    assert d.progress.step == Step.verifying and d.actions == []
    assert step(t, p, healthy(state="transitioning")).actions == []
    assert step(t, p, healthy()).actions == [Action.start_owner_transition]


def test_a_start_whose_save_was_lost_is_not_posted_again():
    """A pass started the owner's transition and could not save that (the API server was
    killed): the saved progress still says Delivering. The next pass must not ask the owner
    again, whether it is still reloading or already on the target (the chaos soak's seed 326:
    a second, no-op in-place transition became the strategy of a switch that reloaded)."""
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.delivering, "started_at": 100.0, "delivery": "bd"})
    staged = DeliveryObservation(phase="Staged", verified=True, fetched=10, method="graph-only")
    d = step(t, p, healthy(state="transitioning", delivery=staged))
    assert d.progress.step == Step.applying and d.actions == [] and d.progress.method == "graph-only"
    d = step(t, p, healthy(identity_bundle=B, delivery=staged))
    assert d.progress.step == Step.verifying and d.actions == []
    d = step(t, p, healthy(delivery=staged))   # not started yet: started now, as before
    assert d.progress.step == Step.applying and d.actions == [Action.start_owner_transition]
    lock = lockstep(1)
    d = step(lock, p, healthy(state="transitioning", delivery=staged))
    assert d.progress.step == Step.preparing and d.actions == []


def test_lost_owner_transition_is_a_failure_not_a_retry():
    t = state()
    d = step(t, applying(t), healthy(owner_transition=None))
    assert d.progress.step == Step.failed and d.progress.reason == "OwnerTransitionLost"
    d = step(t, applying(t), healthy(owner_transition=None, state=None))
    assert d.progress.step == Step.applying


def test_max_unavailable_and_stop_on_failure():
    t = state(4)
    assert owners_to_start(t, 2) == [0, 1]
    t.owners[0] = t.owners[0].model_copy(update={"step": Step.applying})
    assert owners_to_start(t, 2) == [1]
    t.owners[1] = t.owners[1].model_copy(update={"step": Step.failed})
    assert owners_to_start(t, 2) == []
    assert outcome(t) == "running"  # owner 0 still active
    t.owners[0] = t.owners[0].model_copy(update={"step": Step.done})
    assert outcome(t) == "failed"


def test_summary_sums_bytes_and_keeps_every_key():
    t = state(2)
    for i in range(2):
        t.owners[i] = t.owners[i].model_copy(update={
            "step": Step.done, "started_at": 100.0, "delivered_at": 101.0 + i, "applied_at": 103.0 + i,
            "finished_at": 104.0 + i, "strategy": "InPlace", "method": "graph-only", "node": f"node-{1 - i}",
            "bytes": Bytes(fetched=10 + i, reused=100, written=10, peers=4 * i)})
    t.result = "succeeded"
    s = summarize(t, now=110.0)
    assert s["bytes"] == {"fetched": 21, "reused": 200, "written": 20, "peers": 4}
    # and per node, in node order: what each node's bridge moved, and took from peers
    assert s["nodes"] == [{"node": "node-0", "owners": 1, "fetched": 11, "reused": 100, "written": 10, "peers": 4},
                          {"node": "node-1", "owners": 1, "fetched": 10, "reused": 100, "written": 10, "peers": 0}]
    assert s["durations"]["deliverSeconds"] == 2.0 and s["durations"]["applySeconds"] == 2.0
    assert s["durations"]["totalSeconds"] == 10.0
    assert (s["from"], s["to"], s["result"], s["strategy"], s["reason"]) == (A, B, "succeeded", "InPlace", None)


def test_status_round_trip_uses_camel_case():
    t = state()
    dumped = t.dump()
    assert dumped["from"] == A and dumped["owners"][0]["podUID"] == "u0"
    assert TransitionState.model_validate(dumped) == t


@pytest.mark.parametrize("step_", [Step.delivering, Step.applying, Step.verifying])
def test_owner_pod_gone_mid_step_is_replaced(step_):
    t = state()
    p = t.owners[0].model_copy(update={"step": step_, "started_at": 100.0, "delivery": "bd",
                                       "owner_transition": "ot1"})
    d = step(t, p, OwnerObservation(pod_exists=False))
    assert d.progress.step == Step.replacing and d.actions == [Action.replace_owner]
    assert "disappeared" in d.progress.message


def test_rollout_of_five_owners_never_exceeds_max_unavailable():
    """Drive the pure machine like the executor does: every started owner is staged and
    applied one step per pass; at most two owners are ever between Waiting and Done."""
    t = state(5)
    on = {o.slot: A for o in t.owners}
    seen_active, now = [], 100.0
    for _ in range(40):
        startable = set(owners_to_start(t, 2))
        for i, p in enumerate(t.owners):
            if p.step == Step.waiting and p.slot not in startable:
                continue
            obs = healthy(pod_uid=p.pod_uid, identity_bundle=on[p.slot],
                          delivery=DeliveryObservation(phase="Staged", verified=True),
                          owner_transition={"result": "succeeded"})
            d = step(t, p, obs, now=now)
            if Action.start_owner_transition in d.actions:
                on[p.slot] = B              # the owner applies the target
                d.progress = d.progress.model_copy(update={"owner_transition": f"ot{p.slot}"})
            if Action.create_delivery in d.actions:
                d.progress = d.progress.model_copy(update={"delivery": f"bd{p.slot}"})
            t.owners[i] = d.progress
        seen_active.append(sum(1 for o in t.owners if o.step in ACTIVE_STEPS))
        now += 1
        if outcome(t) != "running":
            break
    assert outcome(t) == "succeeded" and set(on.values()) == {B}
    assert max(seen_active) == 2 and all(n <= 2 for n in seen_active)


def test_overhead_is_what_neither_the_bridge_nor_the_owner_reports():
    """overheadSeconds = total - (the bridge's staging + the owner's own transition)."""
    t = state()
    p = step(t, t.owners[0], healthy()).progress.model_copy(update={"delivery": "bd"})
    p = step(t, p, healthy(delivery=DeliveryObservation(phase="Staged", verified=True, method="rebase",
                                                        duration_seconds=0.30)), now=101.4).progress
    p = step(t, p.model_copy(update={"owner_transition": "ot1"}),
             healthy(owner_transition={"result": "succeeded", "timings": {"totalSeconds": 0.25,
                                                                         "firstTokenSeconds": 0.1}}),
             now=101.7).progress
    assert (p.staging_seconds, p.owner_seconds) == (0.30, 0.25)
    t.owners[0] = p.model_copy(update={"step": Step.done, "finished_at": 101.8})
    d = summarize(t, now=101.0 + 0.8)["durations"]     # planned at 100.0: total 1.8 s
    assert (d["stagingSeconds"], d["ownerSeconds"], d["totalSeconds"]) == (0.3, 0.25, 1.8)
    assert d["overheadSeconds"] == 1.25


def test_a_retrying_delivery_keeps_the_owner_delivering_and_says_why():
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.delivering, "delivery": "bd", "started_at": 100.0})
    retrying = DeliveryObservation(phase="Failed", reason="StoreFull", message="no space in the node store",
                                   attempts=2, next_attempt_time="2026-01-01T00:00:10Z")
    d = step(t, p, healthy(delivery=retrying))
    assert d.progress.step == Step.delivering and d.actions == []
    assert d.progress.reason == "DeliveryFailed" and "StoreFull no space" in d.progress.message
    staged = step(t, d.progress, healthy(delivery=DeliveryObservation(phase="Staged", verified=True)))
    assert staged.progress.step == Step.applying and staged.progress.reason == ""
    late = step(t, d.progress, healthy(delivery=retrying), now=800.0, timeout=600)
    assert late.progress.step == Step.failed and late.progress.reason == "DeliveryFailed"
    assert "no space" in late.progress.message and "within 600s" in late.progress.message


def test_a_failed_status_of_an_earlier_generation_is_not_this_switchs_failure():
    """A switch back to a kept revision activates its delivery (a new generation); until the
    bridge answers it, the status is the earlier generation's. The chaos soak (seed 31)
    saw a switch fail in 0.5 s on such a stale Failed."""
    t = state()
    p = t.owners[0].model_copy(update={"step": Step.delivering, "delivery": "bd", "started_at": 100.0})
    stale = DeliveryObservation(phase="Failed", reason="NotAuthorized", current=False)
    d = step(t, p, healthy(delivery=stale))
    assert d.progress.step == Step.delivering and d.actions == []
    answered = DeliveryObservation(phase="Failed", reason="NotAuthorized", current=True)
    assert step(t, p, healthy(delivery=answered)).progress.step == Step.failed


def test_a_prestaged_owner_applies_at_once_and_is_done_once_current_has_moved():
    t = state()
    p = step(t, t.owners[0], healthy()).progress.model_copy(update={"delivery": "bd", "prestaged": True})
    staged_ahead = DeliveryObservation(phase="Staged", verified=True, fetched=10, reused=90,
                                       written=10, method="rebase", duration_seconds=1.5)
    d = step(t, p, healthy(delivery=staged_ahead))
    assert d.progress.step == Step.applying and d.actions == [Action.start_owner_transition]
    # the bytes and the seconds were the stage's, spent before this transition
    assert d.progress.bytes == Bytes() and d.progress.staging_seconds is None
    p = d.progress.model_copy(update={"step": Step.releasing})
    restaging = DeliveryObservation(phase="Staging", current=True)   # the bridge moves `current`
    assert step(t, p, healthy(identity_bundle=B, delivery=restaging)).progress.step == Step.releasing
    answered_before = DeliveryObservation(phase="Staged", verified=True, current=False)
    assert step(t, p, healthy(identity_bundle=B, delivery=answered_before)).progress.step == Step.releasing
    settled = DeliveryObservation(phase="Staged", verified=True)
    d = step(t, p, healthy(identity_bundle=B, delivery=settled))
    assert d.progress.step == Step.done
    t.owners[0] = d.progress
    assert summarize(t, 103.0)["prestaged"] is True
    t.owners[0] = d.progress.model_copy(update={"prestaged": False})
    assert summarize(t, 103.0)["prestaged"] is False


def lockstep(n=3):
    t = state(n)
    t.commit = "Lockstep"
    return t


def test_lockstep_starts_everyone_prepares_then_passes_the_barrier_together():
    from resident_operator.transition import at_barrier, must_abort
    t = lockstep()
    assert owners_to_start(t, max_unavailable=1) == [0, 1, 2]   # preparing takes nobody out
    staged = DeliveryObservation(phase="Staged", verified=True)
    for i, p in enumerate(t.owners):
        p = step(t, p, healthy()).progress.model_copy(update={"delivery": f"bd{i}"})
        d = step(t, p, healthy(delivery=staged))
        assert d.progress.step == Step.preparing and d.actions == [Action.start_owner_transition]
        p = d.progress.model_copy(update={"owner_transition": f"ot{i}"})
        assert step(t, p, healthy(owner_transition={"result": "running"})).progress.step == Step.preparing
        t.owners[i] = step(t, p, healthy(owner_transition={"result": "prepared"})).progress
        assert t.owners[i].step == Step.prepared
        assert step(t, t.owners[i], healthy()).progress.step == Step.prepared   # waits at the barrier
        assert at_barrier(t) == (i == 2)
    assert not must_abort(t) and outcome(t) == "running"
    t.committed = True
    p = step(t, t.owners[0], healthy()).progress
    assert p.step == Step.applying
    # a commit that got lost (the operator restarted at the barrier) is sent again
    assert step(t, p, healthy(owner_transition={"result": "prepared"})).actions == [Action.commit_owner_transition]
    d = step(t, p, healthy(owner_transition={"result": "succeeded", "committedAt": 1000.25,
                                             "loadedBeside": True}))
    assert d.progress.step == Step.verifying and d.progress.committed_at == 1000.25
    assert d.progress.loaded_beside is True


def test_lockstep_one_owner_that_cannot_prepare_aborts_them_all():
    from resident_operator.transition import ABORTED, abort, first_failure, must_abort
    t = lockstep(2)
    t.owners[0] = t.owners[0].model_copy(update={"step": Step.prepared, "owner_transition": "ot0",
                                                 "started_at": 100.0})
    p = t.owners[1].model_copy(update={"step": Step.preparing, "owner_transition": "ot1", "started_at": 100.0})
    d = step(t, p, healthy(owner_transition={"result": "failed", "reason": "target revision rejected"}))
    assert d.progress.step == Step.failed and d.progress.reason == "PrepareFailed"
    assert d.actions == [Action.abort_owner_transition, Action.release_target_delivery]
    t.owners[1] = d.progress
    assert must_abort(t)
    a = abort(t.owners[0], 102.0, "owner m-owner-1 failed")
    assert a.progress.reason == ABORTED and Action.abort_owner_transition in a.actions
    t.owners[0] = a.progress
    assert first_failure(t).pod == "m-owner-1" and outcome(t) == "failed" and not must_abort(t)
    # an owner lost before the commit fails the switch rather than being replaced on the target
    t2 = lockstep(1)
    p = t2.owners[0].model_copy(update={"step": Step.delivering, "delivery": "bd", "started_at": 100.0})
    assert step(t2, p, healthy(pod_exists=False)).progress.reason == "OwnerLost"
    assert step(t2, t2.owners[0], healthy(running=False)).progress.reason == "OwnerNotReady"


def test_skew_is_first_to_last_commit_by_the_owners_clocks():
    t = lockstep(3)
    t.owners = [o.model_copy(update={"step": Step.done, "committed_at": 1000.0 + x})
                for o, x in zip(t.owners, (0.01, 0.0, 0.03))]
    s = summarize(t, 103.0)
    assert s["commit"] == "Lockstep" and s["skewSeconds"] == pytest.approx(0.03)
    assert all("loadedBeside" not in c for c in s["commits"])   # not reloads prepared beside
    t.owners[0] = t.owners[0].model_copy(update={"loaded_beside": False})
    assert summarize(t, 103.0)["commits"][0]["loadedBeside"] is False   # a backend that could not
    assert [c["committedAt"] for c in s["commits"]] == ["1970-01-01T00:16:40.010000Z",
                                                        "1970-01-01T00:16:40.000000Z",
                                                        "1970-01-01T00:16:40.030000Z"]
