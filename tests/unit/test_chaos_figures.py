"""The chaos soak's schedule and figures (localcluster.chaos): the same seed replays the
same faults, and every failed request is put down to a documented gap or to a defect from
the record alone."""

from __future__ import annotations

from dataclasses import asdict

from localcluster import chaos
from localcluster.chaos import Fault, Injected, Switch

KINDS = chaos.ONE_NODE_FAULTS


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    one = chaos.schedule(31, 600, KINDS)
    assert one == chaos.schedule(31, 600, KINDS)
    assert one != chaos.schedule(32, 600, KINDS)
    gaps = [b.at - a.at for a, b in zip(one, one[1:])]
    assert all(10 <= g <= 30 for g in gaps) and 10 <= one[0].at <= 30 and one[-1].at < 600
    assert {f.kind for f in one} <= set(KINDS) and len({f.kind for f in one}) > 1
    assert all(3 <= f.hold <= 10 for f in one)


def record(faults=(), switches=(), failed=()) -> dict:
    return {"seed": 1, "duration_seconds": 100, "end_seconds": 150, "kinds": list(KINDS),
            "models": {"ns/m": {"replicas_at_end": 2}}, "schedule": [asdict(i.fault) for i in faults],
            "faults": [asdict(i) for i in faults], "switches": [asdict(s) for s in switches],
            "requests": {"ns/m": {"sent": 500, "failed": [list(a) for a in failed]}},
            "settled": {"ok": True, "seconds": 120}, "leaks": [], "left_after_delete": []}


def injected(kind: str, start: float, recovered: float | None, affects=("ns/m",), sole=(),
             whole: float | None = -1.0) -> Injected:
    return Injected(Fault(start, kind, 0, 5.0), target="x", affects=list(affects), start=start,
                    sole=list(sole), cleared=start + 5, recovered=recovered,
                    whole=recovered if whole == -1.0 else whole)


def test_a_failure_while_the_models_owner_hung_is_owner_lost_and_outside_it_a_defect():
    raw = record([injected("owner-stalled", 10, 30)])
    assert chaos.attribute(raw, "ns/m", [12, 13, 0, "", "ReadTimeout"]) == "owner-lost"
    assert chaos.attribute(raw, "ns/m", [31, 32, 0, "", "refused"]) == "defect"
    other = record([injected("owner-stalled", 10, 30, affects=("ns/other",))])
    assert chaos.attribute(other, "ns/m", [12, 13, 0, "", "ReadTimeout"]) == "defect"


def test_a_deleted_owner_is_a_gap_only_when_it_was_the_models_sole_owner():
    drained = record([injected("owner-deleted", 10, 30)])                  # another owner served
    assert chaos.attribute(drained, "ns/m", [12, 13, 0, "", "reset"]) == "defect"
    sole = record([injected("owner-deleted", 10, 30, sole=("ns/m",))])
    assert chaos.attribute(sole, "ns/m", [12, 13, 0, "", "refused"]) == "owner-lost"


def test_a_503_with_retry_after_is_a_gap_only_in_a_one_replica_reload():
    reload1 = Switch("ns/m", "reload", 20, to="sha256:b", replicas=1, end=25, result="succeeded", strategy="Reload")
    assert chaos.attribute(record(switches=[reload1]), "ns/m", [21, 22, 503, "1", ""]) == "reload-503"
    assert chaos.attribute(record(switches=[reload1]), "ns/m", [21, 22, 503, "", ""]) == "defect"
    reload2 = Switch("ns/m", "reload", 20, to="sha256:b", replicas=2, end=25, result="succeeded", strategy="Reload")
    assert chaos.attribute(record(switches=[reload2]), "ns/m", [21, 22, 503, "1", ""]) == "defect"
    in_place = Switch("ns/m", "auto", 20, to="sha256:b", replicas=1, end=25, result="succeeded", strategy="InPlace")
    assert chaos.attribute(record(switches=[in_place]), "ns/m", [21, 22, 503, "1", ""]) == "defect"


def test_the_summary_counts_switches_failures_recovery_and_leaks_from_the_record():
    faults = [injected("bridge-killed", 10, 14, affects=()), injected("bridge-killed", 40, 50, affects=()),
              injected("owner-stalled", 60, 70)]
    faults.append(Injected(Fault(80, "source-down", 0, 4), "src", [], 80, error="RuntimeError: x"))
    switches = [Switch("ns/m", "auto", 5, to="a", end=7, result="succeeded"),
                Switch("ns/m", "staged", 20, to="b", end=30, result="failed-and-rolled-back"),
                Switch("ns/m", "scale", 90, replicas=3, end=150, result="stuck")]
    raw = record(faults, switches, failed=[(61, 62, 0, "", "t"), (100, 101, 0, "", "refused")])
    raw["leaks"] = ["node-0: lease delivery:x on sha256:0 of nothing live"]
    s = chaos.summarize(raw)
    assert s["switches"]["attempted"] == 3 and s["switches"]["succeeded"] == 1
    assert s["switches"]["failed-and-rolled-back"] == 1 and s["switches"]["stuck"] == 1
    assert s["requests"] == {"sent": 500, "failed": 2, "owner-lost": 1, "reload-503": 0, "route-lost": 0,
                             "defect": 1}
    assert s["recovery_seconds"]["bridge-killed"] == {"n": 2, "median": 7.0, "p95": 10.0, "max": 10.0}
    assert s["faults"]["made"] == 3 and s["faults"]["not_made"] == 1
    assert s["leaks"] == 1 and s["settled"] is True


def test_a_connection_lost_with_the_node_that_carried_the_route_to_the_services_is_route_lost():
    """The machine reaches ClusterIPs through node-0 first; when that node goes down the
    route moves to the first node up and stays there, so node-0's second cut is no gap."""
    def node_fault(kind, name, start, cleared):
        return Injected(Fault(start, kind, 0, 5.0), target=f"node {name}", affects=[], start=start,
                        cleared=cleared, recovered=cleared + 20)
    faults = [node_fault("node-power-cut", "node-0", 10, 15),      # the route moves to node-1
              node_fault("node-network-cut", "node-0", 100, 105),  # not the route any more
              node_fault("node-power-cut", "node-1", 200, 205)]    # the route: it moves back to node-0
    raw = record(faults)
    raw["nodes"] = ["node-0", "node-1", "node-2"]
    assert chaos.gateway_faults(raw) == {0, 2}
    assert chaos.attribute(raw, "ns/m", [9.5, 10.2, 0, "", "reset"]) == "route-lost"
    assert chaos.attribute(raw, "ns/m", [99.5, 100.2, 0, "", "reset"]) == "defect"
    assert chaos.attribute(raw, "ns/m", [204, 204.5, 0, "", "refused"]) == "route-lost"
    assert chaos.attribute(raw, "ns/m", [204, 204.5, 503, "1", ""]) == "defect"   # an answer came: not the route
    assert chaos.attribute(raw, "ns/m", [230, 231, 0, "", "refused"]) == "defect"  # after it was back


def _timed_soak(isolated: bool, recover_after: float) -> list[float]:
    """When each planned fault was made, with the fault injection stubbed out: each fault
    'recovers' ``recover_after`` seconds after it is made."""
    import threading
    import time
    soak = chaos.Soak.__new__(chaos.Soak)
    soak.plan = [Fault(0.05, "owner-deleted", 0, 0.0), Fault(0.25, "owner-deleted", 0, 0.0),
                 Fault(0.45, "owner-deleted", 0, 0.0)]
    soak.duration, soak.isolated, soak._stop, soak.t0 = 1.5, isolated, threading.Event(), time.monotonic()
    made: list[float] = []

    def inject(f):
        made.append(soak.now())
        record = Injected(f, target="x", affects=[], start=soak.now(), cleared=soak.now())
        threading.Timer(recover_after, lambda: setattr(record, "recovered", soak.now())).start()
        return record

    soak._inject = inject
    soak._faults()
    return made


def test_isolated_faults_wait_for_the_last_recovery_then_their_gap_and_stop_at_the_duration():
    overlapping = _timed_soak(isolated=False, recover_after=0.5)
    assert len(overlapping) == 3 and all(0 <= t - at < 0.1 for t, at in zip(overlapping, (0.05, 0.25, 0.45)))
    isolated = _timed_soak(isolated=True, recover_after=0.5)
    # the second comes 0.5 s (recovery) + 0.2 s (its gap) after the first; the third would be
    # due at about 1.9 s, after the 1.5 s duration, so it is not made
    assert len(isolated) == 2 and 0.65 <= isolated[1] - isolated[0] <= 0.9, isolated


def test_endpoints_are_read_for_failures_no_unrecovered_fault_explains(monkeypatch):
    import threading
    import time
    from types import SimpleNamespace as NS
    from localcluster.traffic import Answer

    asked = []

    class Discovery:
        def __init__(self, api_client):
            pass

        def list_namespaced_endpoint_slice(self, namespace, label_selector):
            asked.append((namespace, label_selector))
            e = NS(target_ref=NS(name="m-owner-0"), node_name="node-1", addresses=["10.0.0.5"],
                   conditions=NS(ready=False, serving=True, terminating=True))
            return NS(items=[NS(endpoints=[e])])

    monkeypatch.setattr(chaos.client, "DiscoveryV1Api", Discovery)
    soak = chaos.Soak.__new__(chaos.Soak)
    soak.t0, soak._lock, soak.endpoints = time.monotonic(), threading.Lock(), []
    soak.core = NS(api_client=None)
    # the gateway's conntrack, read for real (on this machine: no SYN to this address waits)
    soak.cluster = NS(network=NS(service_gateway=NS(enter=lambda: [])))
    ok, failed = Answer(1.0, 1.1, 200), Answer(1.2, 1.3, 0, error="refused")
    hit = chaos.SoakModel(NS(namespace="a", name="m"), 1, load=NS(answers=[ok, failed], address="10.96.0.9:8000"))
    calm = chaos.SoakModel(NS(namespace="b", name="m"), 1, load=NS(answers=[ok, failed], address="10.96.0.9:8000"))
    soak.models = [hit, calm]
    soak.injected = [injected("owner-stalled", 0.5, None, affects=("a/m",))]   # not recovered yet
    soak._note_failures()
    assert asked == [("b", "kubernetes.io/service-name=m")]   # a/m's failure is its fault's
    (snap,) = soak.endpoints
    assert snap["model"] == "b/m" and len(snap["failed_starts"]) == 1
    assert snap["endpoints"] == [{"pod": "m-owner-0", "node": "node-1", "addresses": ["10.0.0.5"],
                                  "ready": False, "serving": True, "terminating": True}]
    assert snap["unanswered_syns"] == [], snap   # a connection error: conntrack was asked
    soak._note_failures()                     # nothing new: no second reading
    assert len(soak.endpoints) == 1 and hit.seen == calm.seen == 2


def test_a_failure_window_lasts_until_the_models_are_whole_and_records_before_whole_end_at_recovery():
    raw = record([injected("owner-stalled", 10, 20, whole=30)])
    assert chaos.attribute(raw, "ns/m", [25, 26, 0, "", "ReadTimeout"]) == "owner-lost"
    assert chaos.attribute(raw, "ns/m", [31, 32, 0, "", "ReadTimeout"]) == "defect"
    del raw["faults"][0]["whole"], raw["faults"][0]["slots"]   # a record of the hours before either was kept
    assert chaos.attribute(raw, "ns/m", [25, 26, 0, "", "ReadTimeout"]) == "defect"
    assert chaos.summarize(raw)["recovery_rule"] == "every model whole"


def test_the_summary_gives_recovery_whole_and_switch_times_under_faults_and_clear_of_them():
    faults = [injected("operator-killed", 10, 14, affects=(), whole=40), injected("operator-killed", 100, 103,
                                                                                 affects=(), whole=None)]
    switches = [Switch("ns/m", "reload", 30, to="a", end=38, result="succeeded"),    # under the first
                Switch("ns/m", "auto", 50, to="b", end=52, result="succeeded"),      # clear
                Switch("ns/m", "auto", 140, to="c", end=149, result="succeeded"),    # under the second: never whole
                Switch("ns/m", "scale", 60, replicas=3, end=70, result="succeeded")]  # no switch of revision
    s = chaos.summarize(record(faults, switches))
    assert s["recovery_rule"] == "lost slots back, switches allowed"
    assert s["recovery_seconds"]["operator-killed"] == {"n": 2, "median": 3.5, "p95": 4.0, "max": 4.0}
    assert s["whole_seconds"]["operator-killed"] == {"n": 1, "median": 30.0, "p95": 30.0, "max": 30.0}
    assert s["switch_seconds"]["under_a_fault"]["n"] == 2 and s["switch_seconds"]["under_a_fault"]["max"] == 9.0
    assert s["switch_seconds"]["clear_of_faults"] == {"n": 1, "median": 2.0, "p95": 2.0, "max": 2.0}


def test_a_powered_off_nodes_return_is_broken_down_from_power_on_by_its_slowest_owner():
    cut = injected("node-power-cut", 100, 130)
    cut.phases = {"powered_on": 106, "node_ready": 108, "bridge_ready": 111, "owners": {
        "ns/m#0": {"sandbox": 112, "started": 113, "ready": 120, "failed_mounts": 0},
        "ns/m#1": {"sandbox": 115, "started": 118, "ready": 125, "failed_mounts": 2}}}
    half = injected("node-power-cut", 200, 220)   # an owner whose start the API server did not give
    half.phases = {"powered_on": 204, "node_ready": 206, "bridge_ready": 208,
                   "owners": {"ns/m#0": {"sandbox": 209, "started": None, "ready": 215}}}
    older = injected("node-power-cut", 300, 330)   # recorded before the breakdown was kept
    steps = chaos.summarize(record([cut, half, older]))["power_on_to_seconds"]
    assert steps["node_ready"]["n"] == 2 and steps["node_ready"]["median"] == 2.0
    assert steps["sandbox"]["max"] == 9.0              # the slower owner's, not the first's
    assert steps["started"] == {"n": 1, "median": 12.0, "p95": 12.0, "max": 12.0}
    assert steps["ready"]["max"] == 19.0 and steps["recovered"]["max"] == 24.0
    assert "power_on_to_seconds" not in chaos.summarize(record([older]))


def test_a_fault_recovers_when_the_owners_it_took_answer_again_and_every_model_but_its_switch_serves(monkeypatch):
    """Every model in a fault's scope serves with all its replicas but the one a switch of
    the driver's takes away, and the owners' slots the fault took answer again (a killed
    operator: once its new container is named). ``whole`` waits for every model in scope
    with all its replicas, switches or not."""
    import threading
    import time
    from types import SimpleNamespace as NS

    soak = chaos.Soak.__new__(chaos.Soak)
    soak.t0, soak._lock = time.monotonic(), threading.Lock()
    a, b = chaos.SoakModel(NS(namespace="ns", name="a"), 2), chaos.SoakModel(NS(namespace="ns", name="b"), 3)
    soak.models = [a, b]
    soak.switches = [Switch("ns/b", "reload", 0.0, to="x", replicas=3)]          # b is switching
    serving = {"ns/a": {"ns/a#0", "ns/a#1"}, "ns/b": {"ns/b#0", "ns/b#2"}}        # b#1 reloads, or is gone
    system = {"unready": [], "containers": {"containerd://operator-1"}, "led": None}   # no leader election
    monkeypatch.setattr(soak, "_system", lambda: (system["unready"], system["containers"], system["led"]),
                        raising=False)
    monkeypatch.setattr(soak, "_serving", lambda m, rm: (len(serving[m.key]), serving[m.key]), raising=False)
    shared = injected("operator-killed", 0.0, None, affects=(), whole=None)
    shared.container = "containerd://operator-1"                                 # the killed one
    took_b1 = injected("owner-deleted", 0.0, None, affects=("ns/b",), whole=None)
    took_b1.slots = ["ns/b#1"]
    took_b2 = injected("owner-deleted", 0.0, None, affects=("ns/b",), whole=None)
    took_b2.slots = ["ns/b#2"]
    soak.injected = [shared, took_b1, took_b2]
    states = {"ns/a": {}, "ns/b": {}}
    soak._follow_recovery(states)         # the API server still names the killed container
    assert shared.recovered is None
    assert took_b2.recovered is not None  # its slot serves again; b is a replica short for its switch
    assert took_b1.recovered is None      # the slot it took does not answer yet
    assert set(shared.held) == {"the killed container still named"}
    assert set(took_b1.held) == {"slot ns/b#1 not answering"} and took_b2.held == {}
    system["unready"] = ["pod bridge-x not Ready"]
    soak._follow_recovery(states)
    assert "pod bridge-x not Ready" in took_b1.held and "pod bridge-x not Ready" not in took_b2.held
    system["unready"], system["containers"] = [], {"containerd://operator-2"}
    soak._follow_recovery(states)
    assert shared.recovered is not None and shared.whole is None and took_b1.recovered is None
    soak.switches[0].end = 1.0                                                    # b's switch ended
    serving["ns/b"] = {"ns/b#0", "ns/b#1", "ns/b#2"}
    soak._follow_recovery(states)
    assert shared.whole is not None and took_b1.recovered is not None and took_b1.whole is not None
    staged = Switch("ns/a", "staged", 0.0, to="y", replicas=2)                    # staging is no switch yet
    soak.switches.append(staged)
    assert soak._switch_allowance(a) == 2
    staged.staged_at = 0.5
    assert soak._switch_allowance(a) == 1


def test_a_slot_the_driver_scaled_away_after_the_fault_is_not_waited_for(monkeypatch):
    """A node fault took slot b#2; the driver then scaled b from 3 replicas to 2, so the
    operator removed slot 2 and nothing will answer there again: the fault recovers once
    the slots b still has answer (the eighth hour waited 160 s on such a slot). Scaled up
    again, the slot is b's once more and is waited for."""
    import threading
    import time
    from types import SimpleNamespace as NS

    soak = chaos.Soak.__new__(chaos.Soak)
    soak.t0, soak._lock = time.monotonic(), threading.Lock()
    b = chaos.SoakModel(NS(namespace="ns", name="b"), 2)                          # scaled 3 -> 2
    soak.models, soak.switches = [b], []
    serving = {"ns/b": {"ns/b#0", "ns/b#1"}}
    monkeypatch.setattr(soak, "_system", lambda: ([], set(), None), raising=False)
    monkeypatch.setattr(soak, "_serving", lambda m, rm: (len(serving[m.key]), serving[m.key]), raising=False)
    cut = injected("node-network-cut", 0.0, None, affects=("ns/b",), whole=None)
    cut.slots = ["ns/b#1", "ns/b#2"]
    soak.injected = [cut]
    soak._follow_recovery({"ns/b": {}})
    assert cut.recovered is not None and cut.held == {}
    b.replicas = 3                                                                # scaled back up
    again = injected("node-network-cut", 0.0, None, affects=("ns/b",), whole=None)
    again.slots = ["ns/b#2"]
    soak.injected = [again]
    soak._follow_recovery({"ns/b": {}})
    assert again.recovered is None and set(again.held) == {"slot ns/b#2 not answering", "ns/b serves 2 of 3"}


def test_a_killed_operator_recovers_when_an_operator_renews_the_leader_lease_after_it(monkeypatch):
    """With leader election, a killed operator has recovered once the Lease is renewed after
    the kill was over (a standby took over, or the killed one is back), not when its own Pod
    is back: kubelet may hold that container for minutes in its crash-loop back-off."""
    import threading
    import time
    from types import SimpleNamespace as NS

    soak = chaos.Soak.__new__(chaos.Soak)
    soak.t0, soak._lock = time.monotonic() - 100, threading.Lock()
    soak.models, soak.switches = [chaos.SoakModel(NS(namespace="ns", name="a"), 1)], []
    monkeypatch.setattr(soak, "_serving", lambda m, rm: (1, {"ns/a#0"}), raising=False)
    killed = injected("operator-killed", 90.0, None, affects=(), whole=None)
    killed.cleared, killed.container = 90.0, "containerd://operator-1"     # cleared 10 s ago
    soak.injected = [killed]
    renewed = {"at": time.time() - 12}                                     # before the kill
    monkeypatch.setattr(soak, "_system", lambda: ([], {"containerd://operator-1"}, renewed["at"]),
                        raising=False)
    soak._follow_recovery({"ns/a": {}})
    assert killed.recovered is None and "the operator Lease not renewed since the kill" in killed.held
    renewed["at"] = time.time()                                            # a standby leads now
    soak._follow_recovery({"ns/a": {}})                                    # though the API server still names the dead one
    assert killed.recovered is not None


def test_the_installation_is_whole_without_a_standby_in_back_off_while_an_operator_leads(monkeypatch):
    """Operator Pods that are not Ready do not count while an operator holds a fresh Lease;
    a stale Lease (nobody leads) makes the installation not whole."""
    import time
    from types import SimpleNamespace as NS

    def pod(name, component, ready):
        return NS(metadata=NS(name=name, deletion_timestamp=None, labels={"app.kubernetes.io/component": component}),
                  status=NS(conditions=[NS(type="Ready", status="True" if ready else "False")],
                            container_statuses=[NS(container_id=f"containerd://{component}")]))
    soak = chaos.Soak.__new__(chaos.Soak)
    soak.installation = NS(namespace="resident")
    pods = [pod("op-0", "operator", True), pod("op-1", "operator", False), pod("bridge-0", "bridge", True)]
    soak.core = NS(list_namespaced_pod=lambda ns: NS(items=pods))
    lease = {"value": (time.time() - 1, 15.0)}
    monkeypatch.setattr(soak, "_lease_renewed", lambda: lease["value"], raising=False)
    assert soak._system()[0] == []
    lease["value"] = (time.time() - 20, 15.0)                               # nobody renewed it
    assert soak._system()[0] == ["the operator Lease not renewed within its duration"]
    lease["value"] = None                                                  # no leader election: every Pod counts
    assert soak._system()[0] == ["pod op-1 not Ready"]


def test_a_filled_store_holds_a_tenth_beyond_its_high_watermark_until_gc_takes_it_back(tmp_path):
    """The store-filled fault puts a revision no one uses into a node store beside its
    bridge; the fault has recovered, and no store leaks, only once GC is back under."""
    from bundle.store import Store
    soak = chaos.Soak.__new__(chaos.Soak)
    soak.store_high = 8 << 20
    root = tmp_path / "store"
    before, after = soak._fill_store(root)
    assert before == 0 and after >= (8 << 20) * 11 // 10 and Store(root).usage_bytes() == after
    assert not soak._under_watermark(root)
    Store(root).gc(soak.store_high, soak.store_high * 8 // 10)
    assert soak._under_watermark(root)
    assert "store-filled" in chaos.STORE_FAULTS
