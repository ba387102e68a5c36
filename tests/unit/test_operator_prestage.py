"""Pre-staged revisions without a cluster: what is kept staged, and what status.stage says."""

from resident_operator import naming
from resident_operator.model_state import ModelState, StatusStore
from resident_operator.observe import OwnerView
from resident_operator.prestage import kept_revisions, stage_status, wanted_stages
from resident_operator.spec import parse_spec

A, B, C = ("sha256:" + x * 64 for x in "abc")


def spec(**over):
    raw = {"bundle": {"source": "file:///b/a", "digest": A}, "replicas": 2, **over}
    return parse_spec(raw)


def owner(slot, node, identity=A, **kw):
    return OwnerView(slot=slot, incarnation=0, pod=f"m-owner-{slot}", uid=f"u{slot}", node=node,
                     pod_phase="Running", identity={"bundle": identity}, **kw)


def delivery(slot, digest, status=None, generation=1):
    return {"metadata": {"name": naming.delivery_name("m", slot, 0, digest), "generation": generation},
            "spec": {"activate": False, "bundle": {"digest": digest}}, "status": status or {}}


def test_kept_and_wanted_revisions():
    committed = {"digest": A, "source": "file:///b/a"}
    previous = {"digest": C, "source": "file:///b/c"}
    staged = spec(stage={"source": "file:///b/b", "digest": B})
    assert wanted_stages(staged, committed, previous) == {B: "file:///b/b", C: "file:///b/c"}
    assert kept_revisions(staged, previous) == {B: "file:///b/b", C: "file:///b/c"}
    off = spec(stage={"source": "file:///b/b", "digest": B}, transition={"keepPrevious": False})
    assert wanted_stages(off, committed, previous) == {B: "file:///b/b"}
    # a stage of the live revision asks for nothing; nor does a model without either
    assert wanted_stages(spec(stage={"source": "file:///b/a", "digest": A}), committed, None) == {}
    assert wanted_stages(spec(), committed, None) == {}


def test_stage_status_per_node_and_the_staged_condition():
    s = spec(stage={"source": "file:///b/b", "digest": B})
    owners = [owner(0, "n1"), owner(1, "n2")]
    staging = [delivery(0, B, {"phase": "Staged", "verified": True, "durationSeconds": 1.25,
                               "bytes": {"fetched": 7, "reused": 3, "written": 7, "peers": 5},
                               "finishedAt": "2026-12-03T01:00:00Z"}),
               delivery(1, B, {"phase": "Staging"})]
    status, cond = stage_status("m", s, owners, staging)
    assert status["digest"] == B and status["ready"] == "1/2"
    assert status["nodes"][0] == {"node": "n1", "pod": "m-owner-0", "state": "Staged", "seconds": 1.25,
                                  "bytes": {"fetched": 7, "reused": 3, "written": 7, "peers": 5},
                                  "finishedAt": "2026-12-03T01:00:00Z"}
    assert status["nodes"][1]["state"] == "Staging"
    assert (cond["type"], cond["status"], cond["reason"]) == ("Staged", "False", "Staging")
    failing = staging[:1] + [delivery(1, B, {"phase": "Failed", "reason": "IntegrityMismatch",
                                             "message": "chunk 3 of w.safetensors"})]
    status, cond = stage_status("m", s, owners, failing)
    assert status["nodes"][1]["state"] == "Failed"
    assert cond["status"] == "False" and cond["reason"] == "StageFailed"
    assert "n2" in cond["message"] and "IntegrityMismatch" in cond["message"]
    done = staging[:1] + [delivery(1, B, {"phase": "Staged", "verified": True})]
    status, cond = stage_status("m", s, owners, done)
    assert status["ready"] == "2/2" and (cond["status"], cond["reason"]) == ("True", "Staged")
    # switched to it: the owners run it, and the condition says so
    status, cond = stage_status("m", s, [owner(0, "n1", B), owner(1, "n2", B)], [])
    assert status["ready"] == "2/2" and cond["reason"] == "Live"
    # an owner not yet placed does not count; one beyond spec.replicas neither
    status, _ = stage_status("m", s, owners + [owner(2, "n3"), OwnerView(slot=1, incarnation=1,
                                                                           pod="p", uid="x")], done)
    assert status["ready"] == "2/2"
    assert stage_status("m", spec(), owners, done) == (None, None)


def test_a_switch_remembers_the_revision_left_only_when_kept():
    writes, stored = [], {"bundle": {"digest": A, "source": "file:///b/a"}}

    def write(patch, rv):   # a merge patch, as the API server applies it
        writes.append(patch)
        stored.update({k: v for k, v in patch.items() if v is not None})
        for k in [k for k, v in patch.items() if v is None]:
            stored.pop(k, None)
        return {"metadata": {"resourceVersion": str(len(writes) + 1)}, "status": dict(stored)}

    store = StatusStore(write=write, read=lambda: None, gave_up=lambda m: None)
    state = ModelState(dict(stored), "1", store)
    state.commit_bundle(B, "file:///b/b", keep_previous=True)
    assert state.previous == {"digest": A, "source": "file:///b/a"}
    assert writes[-1]["previousBundle"] == {"digest": A, "source": "file:///b/a"}
    state.commit_bundle(B, "file:///moved/b")   # the same revision at a new source: kept as is
    assert state.previous == {"digest": A, "source": "file:///b/a"} and "previousBundle" not in writes[-1]
    state.commit_bundle(C, "file:///b/c", keep_previous=False)
    assert state.previous is None and writes[-1]["previousBundle"] is None


def test_a_stagings_deliveries_are_created_in_node_name_order(monkeypatch):
    """The first of a rollout's nodes by name fetches from the origin for the others
    (docs/peer-delivery.md): its delivery is created first, whatever its owner's slot."""
    from types import SimpleNamespace

    from resident_operator import prestage
    created = []
    monkeypatch.setattr(prestage, "create_child", lambda ctx, state, bd: created.append(bd["spec"]["nodeName"]) or bd)
    ctx = SimpleNamespace(name="m", uid="uid-m", event=lambda *a, **k: None)
    state = SimpleNamespace(bundle={"digest": A, "source": "file:///b/a"}, previous=None, children=[])
    s = spec(replicas=3, stage={"source": "file:///b/b", "digest": B})
    prestage.ensure_stages(ctx, state, s, [owner(0, "node-2"), owner(1, "node-3"), owner(2, "node-1")], [])
    assert created == ["node-1", "node-2", "node-3"]


def test_preloads_are_asked_of_owners_that_hold_the_stage_and_dropped_when_no_longer_wanted(monkeypatch):
    """spec.stage.preload: an owner whose volume holds the staged revision is asked to load
    it beside the live one; one whose delivery still stages is not yet; a failed preload is
    not asked for again; a preload of another revision is dropped; without preload, none is
    asked for and a held one is dropped. Each node's row says how its preload stands."""
    from types import SimpleNamespace

    from resident_operator import prestage
    from resident_operator.owner_client import OwnerRequest, OwnerUnreachable
    sent, events, rechecks = [], [], []

    class Calls:
        def call_many(self, requests):
            sent.extend((r.method, r.url.split("/")[2], (r.body or {}).get("target")) for r in requests)
            return [OwnerUnreachable("down") if "n4" in r.url else (202, {}) for r in requests]

    class Client:
        def __init__(self, v):
            self.host = v.node

        def request(self, method, path, body=None, allow=()):
            return OwnerRequest("uid-m", "o", method, f"http://{self.host}{path}", "t", body, allow)

    monkeypatch.setattr(prestage, "owner_client", lambda ctx, spec, v: Client(v))
    ctx = SimpleNamespace(name="m", owner_calls=Calls(), event=lambda reason, msg: events.append(reason),
                          follow_up=SimpleNamespace(recheck_in=rechecks.append),
                          settings=SimpleNamespace(owner_recheck_seconds=5.0))
    s = spec(replicas=5, stage={"source": "file:///b/b", "digest": B, "preload": True})
    staged = {"phase": "Staged", "verified": True}
    deliveries = [delivery(0, B, staged), delivery(1, B, {"phase": "Staging"}), delivery(2, B, staged),
                  delivery(3, B, staged), delivery(4, B, staged)]
    owners = [owner(0, "n0", state="ready"),                                   # staged: asked
              owner(1, "n1", state="ready"),                                   # still staging
              owner(2, "n2", state="ready", preload={"digest": B, "state": "failed", "reason": "no memory"}),
              owner(3, "n3", state="ready", preload={"digest": C, "state": "loaded"}),   # another: replaced
              owner(4, "n4", state="ready")]                                   # unreachable when asked
    prestage.ensure_preloads(ctx, s, owners, deliveries)
    assert sent == [("POST", "n0", B), ("POST", "n3", B), ("POST", "n4", B)]
    assert events == ["PreloadRequested"] * 2 and rechecks == [5.0]
    status, _ = stage_status("m", s, owners, deliveries)
    assert [n.get("preload") for n in status["nodes"]] == [
        {"state": "pending"}, {"state": "pending"}, {"state": "failed", "reason": "no memory"},
        {"state": "pending"}, {"state": "pending"}]
    # loading: nothing asked, a look again shortly; the stage removed: every preload dropped
    sent.clear(), rechecks.clear()
    loading = [owner(0, "n0", state="ready", preload={"digest": B, "state": "loading"})]
    prestage.ensure_preloads(ctx, s, loading, deliveries)
    assert sent == [] and rechecks == [5.0]
    prestage.ensure_preloads(ctx, spec(replicas=5, stage={"source": "file:///b/b", "digest": B}), loading,
                             deliveries)
    assert sent == [("DELETE", "n0", None)]
    assert "preload" not in stage_status("m", spec(stage={"source": "file:///b/b", "digest": B}),
                                         loading, deliveries)[0]["nodes"][0]
