"""ModelState writes each change at once, or the changes of one step as one status patch."""

import pytest

from resident_operator.model_state import ModelState


def child(uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{uid}", "uid": uid}}


def test_each_change_is_written_at_once_outside_a_step():
    writes = []
    state = ModelState({}, writes.append)
    state.record_child(child("a"))
    state.commit_bundle("sha256:1", "file:///b")
    assert [sorted(w) for w in writes] == [["children"], ["bundle"]]


def test_the_changes_of_one_step_go_out_as_one_patch_with_the_latest_value_of_each_key():
    writes = []
    state = ModelState({}, writes.append)
    with state.together():
        state.record_child(child("a"))
        state.record_child(child("b"))
        with state.together():              # nested: still the one outer write
            state.commit_bundle("sha256:1", "file:///b")
        assert writes == []
    assert len(writes) == 1
    assert [c["uid"] for c in writes[0]["children"]] == ["a", "b"]
    assert writes[0]["bundle"] == {"digest": "sha256:1", "source": "file:///b"}


def test_a_step_that_fails_still_writes_what_it_recorded():
    writes = []
    state = ModelState({}, writes.append)
    with pytest.raises(RuntimeError):
        with state.together():
            state.record_child(child("a"))
            raise RuntimeError("the owner did not answer")
    assert [c["uid"] for c in writes[0]["children"]] == ["a"]
    state.commit_bundle("sha256:2", "file:///c")   # and writes at once again afterwards
    assert len(writes) == 2
