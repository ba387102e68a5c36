"""ModelState writes each change at once, or the changes of one step as one status patch,
always conditional on the resourceVersion it was computed from; on a conflict it rebases
what it meant onto the fresh status (records merged, progress compare-and-set)."""

import pytest

from resident_operator import model_state
from resident_operator.kube import StatusConflict
from resident_operator.model_state import (ModelState, StatusStore, StatusSuperseded,
                                           StatusWriteGaveUp, rebase)


def child(uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{uid}", "uid": uid}}


def ref(uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "name": f"p-{uid}", "uid": uid}


class Server:
    """The model's status as an API server keeps it: a resourceVersion bumped by every
    write, top-level merge-patch semantics, and a 409 for a stale precondition. ``meddle``
    runs before a write is looked at (another writer getting in first)."""

    def __init__(self, status=None):
        self.status, self.rv = dict(status or {}), 1
        self.writes, self.conflicts, self.meddle = [], 0, []
        self.gave_up = []

    def body(self):
        return {"metadata": {"resourceVersion": str(self.rv), "uid": "m"}, "status": dict(self.status)}

    def apply(self, patch):
        for k, v in patch.items():
            if v is None:
                self.status.pop(k, None)
            else:
                self.status[k] = v
        self.rv += 1

    def write(self, patch, rv):
        if self.meddle:
            self.apply(self.meddle.pop(0))
        if rv is not None and rv != str(self.rv):
            self.conflicts += 1
            raise StatusConflict("stale")
        self.writes.append(patch)
        self.apply(patch)
        return self.body()

    def store(self):
        return StatusStore(write=self.write, read=self.body, gave_up=self.gave_up.append)

    def state(self):
        return ModelState(self.status, str(self.rv), self.store())


def transition(id_: str, **extra) -> dict:
    from resident_operator.transition import TransitionState
    raw = {"id": id_, "from": "sha256:a", "fromSource": "s", "to": "sha256:b", "toSource": "s",
           "strategy": "reload", "path": "whole", "startedAt": 1.0, **extra}
    return TransitionState.model_validate(raw).dump()


def uids(status):
    return [c["uid"] for c in status.get("children") or []]


def test_each_change_is_written_at_once_outside_a_step():
    server = Server()
    state = server.state()
    state.record_child(child("a"))
    state.commit_bundle("sha256:1", "file:///b")
    assert [sorted(w) for w in server.writes] == [["children"], ["bundle"]]
    assert server.conflicts == 0     # each write carries the version the last one left


def test_the_changes_of_one_step_go_out_as_one_patch_with_the_latest_value_of_each_key():
    server = Server()
    state = server.state()
    with state.together():
        state.record_child(child("a"))
        state.record_child(child("b"))
        with state.together():              # nested: still the one outer write
            state.commit_bundle("sha256:1", "file:///b")
        assert server.writes == []
    assert len(server.writes) == 1
    assert uids(server.writes[0]) == ["a", "b"]
    assert server.writes[0]["bundle"] == {"digest": "sha256:1", "source": "file:///b"}


def test_a_step_that_fails_still_writes_what_it_recorded():
    server = Server()
    state = server.state()
    with pytest.raises(RuntimeError):
        with state.together():
            state.record_child(child("a"))
            raise RuntimeError("the owner did not answer")
    assert uids(server.writes[0]) == ["a"]
    state.commit_bundle("sha256:2", "file:///c")   # and writes at once again afterwards
    assert len(server.writes) == 2


def test_a_record_written_meanwhile_by_another_writer_is_kept():
    server = Server({"children": [ref("a")]})
    state = server.state()
    server.meddle.append({"children": [ref("a"), ref("theirs")]})   # the other leader records
    state.record_child(child("mine"))
    assert server.conflicts == 1
    assert sorted(uids(server.status)) == ["a", "mine", "theirs"]
    assert sorted(uids({"children": state.children})) == ["a", "mine", "theirs"]   # in memory too
    state.forget_child("a")                                  # the next write needs no retry
    assert server.conflicts == 1 and sorted(uids(server.status)) == ["mine", "theirs"]


def test_a_forget_applies_to_the_fresh_records_and_removes_only_what_this_pass_forgot():
    server = Server({"children": [ref("a"), ref("b")]})
    state = server.state()
    server.meddle.append({"children": [ref("a"), ref("b"), ref("c")]})
    state.forget_child("a")
    assert uids(server.status) == ["b", "c"]


def test_rebase_merges_records_by_uid_and_counters_by_maximum():
    base = {"children": [ref("a"), ref("b")], "incarnations": {"0": 1, "1": 0}}
    fresh = {"children": [ref("a"), ref("b"), ref("x")], "incarnations": {"0": 3, "1": 0, "2": 1}}
    wanted = {"children": [ref("b"), ref("mine")], "incarnations": {"0": 2, "1": 1}}
    patch, superseded = rebase(base, fresh, wanted)
    assert uids(patch) == ["b", "x", "mine"] and superseded == []
    assert patch["incarnations"] == {"0": 3, "1": 1, "2": 1}


def test_rebase_sets_progress_only_where_nobody_else_moved_it():
    base = {"bundle": {"digest": "d1"}, "transition": {"id": "t", "step": 1}, "pendingTransition": None}
    fresh = {"bundle": {"digest": "d1"}, "transition": {"id": "t", "step": 2}, "pendingTransition": None}
    wanted = {"bundle": {"digest": "d2"}, "transition": {"id": "t", "step": 3}, "pendingTransition": {"to": "x"}}
    patch, superseded = rebase(base, fresh, wanted)
    assert patch == {"bundle": {"digest": "d2"}, "pendingTransition": {"to": "x"}}
    assert superseded == ["transition"]
    same = {"bundle": {"digest": "d1"}, "transition": {"id": "t", "step": 3}}   # already as wanted
    assert rebase(base, same, {"transition": {"id": "t", "step": 3}}) == ({}, [])


def test_a_pass_that_creates_children_writes_them_its_revision_and_its_report_once():
    server = Server()
    state = server.state()
    with state.together():
        state.commit_bundle("sha256:1", "file:///b")
        state.record_child(child("secret"))
        state.record_child(child("pod"))
        state.report({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]})
    assert len(server.writes) == 1
    assert sorted(server.writes[0]) == ["bundle", "children", "conditions", "phase"]
    assert uids(server.status) == ["secret", "pod"] and server.status["phase"] == "Pending"


def test_rebase_writes_what_a_pass_derived_as_it_saw_it():
    base = {"children": [ref("a")]}
    fresh = {"children": [ref("a"), ref("x")], "phase": "Ready", "conditions": [{"type": "Ready"}]}
    wanted = {"children": [ref("a"), ref("mine")], "phase": "Pending", "conditions": []}
    patch, superseded = rebase(base, fresh, wanted)
    assert (patch["phase"], patch["conditions"], superseded) == ("Pending", [], [])
    assert uids(patch) == ["a", "x", "mine"]


def test_progress_another_writer_moved_ends_the_pass_but_its_records_are_written():
    server = Server({"transition": transition("t")})
    state = server.state()
    server.meddle.append({"transition": transition("other"), "children": [ref("theirs")]})
    with pytest.raises(StatusSuperseded) as err:
        with state.together():
            state.record_child(child("mine"))
            state.pending = None
            state.set_pending({"to": "sha256:9"})
            state.save_transition()
    assert err.value.keys == ["transition"]
    assert sorted(uids(server.status)) == ["mine", "theirs"]
    assert server.status["transition"]["id"] == "other"           # theirs, not overwritten
    assert server.status["pendingTransition"] == {"to": "sha256:9"}   # nobody else moved it
    assert state.transition is not None and state.transition.id == "other"   # memory follows


def test_a_transition_written_after_a_conflict_stays_the_object_the_caller_holds():
    server = Server({"transition": transition("t1")})
    state = server.state()
    held = state.transition
    server.meddle.append({"children": [ref("theirs")]})   # an unrelated change
    held.result = "succeeded"
    state.save_transition()
    assert server.conflicts == 1 and state.transition is held
    assert server.status["transition"]["result"] == "succeeded"


def test_it_gives_up_after_a_bounded_number_of_conflicts_and_says_so():
    server = Server()
    state = server.state()
    server.meddle.extend({"phase": f"p{i}"} for i in range(model_state.MAX_WRITE_ATTEMPTS))
    with pytest.raises(StatusWriteGaveUp):
        state.record_child(child("a"))
    assert server.conflicts == model_state.MAX_WRITE_ATTEMPTS
    assert len(server.gave_up) == 1 and "conflicts" in server.gave_up[0]
    assert "children" not in server.status
