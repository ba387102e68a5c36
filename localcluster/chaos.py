"""A chaos soak (issue 31): models under load, switches at random and a seeded schedule of
faults, for a set duration; then figures, and checks that nothing was lost or leaked.

:class:`Soak` runs on a LocalCluster with Resident installed (its chart) and a bundle
server that holds the demo revisions. It applies a few models in namespaces of their own
(some with several replicas), and:

- **load**: a closed loop of clients per model calls its Service all the time
  (:class:`localcluster.traffic.ClosedLoop`);
- **switches**: every few seconds a driver picks an idle model and changes it: a switch
  (delivery and strategy Auto, a whole-bundle reload, a lockstep commit, a switch to a
  revision it staged first), a rollback to the revision kept staged, or a scale change.
  A failed switch is rolled back (``spec.bundle`` set to the committed revision), so every
  model ends on a spec it can run;
- **faults** from :func:`schedule`, one every ``gap`` seconds: an owner Pod deleted, an
  owner hung (SIGSTOP, then SIGCONT), the bridge or the operator killed (SIGKILL: kubelet
  starts them again), a node's kubelet or containerd killed and started again after a
  while (as a service manager would), kube-apiserver or etcd killed and started again,
  the bundle source stopped and started again, with several nodes a node powered off
  or cut from the network and brought back, and when the bridges collect against a budget
  in bytes (``store_high_bytes``) a node store filled a tenth beyond its high watermark
  with a revision no one uses (recovered once GC took it back under the watermark). The
  same seed gives the same schedule and the same choices of the driver (:func:`schedule`
  and the driver's own ``random.Random``), so a failure can be replayed.

With ``isolated`` each fault waits until the one before has recovered, then its gap, so
every recovery time is one fault's alone (faults otherwise overlap a slow recovery).

The record (:meth:`Soak.run`) keeps every fault with its times, every switch, every failed
request with what it is attributed to, the Service's EndpointSlices read when requests
failed (and, after a connection error, the Service gateway's conntrack entries still
waiting for an answer: which endpoint the unanswered SYNs went to), and the checks at the
end; :func:`summarize`
recomputes the figures from it alone. A failed request is attributed to a documented gap
(see docs/chaos.md) or counted as a defect:

- ``owner-lost``: it overlapped a fault that took away an owner of that model (hung, its
  node down or cut; deleted, when it was the model's only owner): kube-proxy still sends
  to an owner until its readiness probe fails or its Pod is gone;
- ``reload-503``: a 503 with ``Retry-After`` from a one-replica model during its reload;
- ``route-lost``: a connection error while the node that carried the clients' way to the
  Services went down (:func:`gateway_faults`): the machine reaches ClusterIPs through one
  node's kube-proxy, and what was in flight through it is lost with it;
- ``defect``: anything else.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests
from kubernetes import client

from . import faults
from .scenario import GROUP, VERSION, Story, condition, db_rows, model_body
from .traffic import ClosedLoop, wait_routed

ONE_NODE_FAULTS = ("owner-deleted", "owner-stalled", "bridge-killed", "operator-killed", "source-down",
                   "kubelet-killed", "containerd-killed", "apiserver-killed", "etcd-killed")
NODE_FAULTS = ("node-power-cut", "node-network-cut")
STORE_FAULTS = ("store-filled",)   # with a GC budget in bytes (``store_high_bytes``)
CONTROL_PLANE_FAULTS = ("apiserver-killed", "etcd-killed")   # no recovery target: reported only
ACTIONS = {"auto": 3, "reload": 2, "staged": 2, "lockstep": 1, "rollback": 1, "scale": 1}   # weights
SWITCH_LIMIT_SECONDS = 240.0   # a switch not done by then is stuck
STAGE_WAIT_SECONDS = 60.0      # a staged switch switches after this even if not staged everywhere
SETTLE_SECONDS = 300.0         # after the last fault: time for every switch to end and model to recover
TICK_SECONDS = 0.5
CLIENT_PAUSE_SECONDS = 0.05    # between a client's answer and its next request: load, not a busy loop
LIVE_CONTAINER_SECONDS = 30.0   # how long a fault waits for the API server to name a restarted container
ISOLATION_LIMIT_SECONDS = 300.0  # isolated: the longest the next fault waits for the last one's recovery
ENDPOINT_SNAPSHOTS = 300         # at most this many EndpointSlice readings at failed requests are kept
SLOT_LABEL = "resident.dev/slot"  # an owner Pod's replica slot (a replacement keeps it)


@dataclass(frozen=True)
class Fault:
    at: float      # seconds after the soak began
    kind: str
    pick: int      # which target, modulo the candidates when it comes
    hold: float    # seconds a held fault lasts (a hang, a source or node down)


def schedule(seed: int, duration: float, kinds: tuple[str, ...], gap: tuple[float, float] = (10.0, 30.0),
             hold: tuple[float, float] = (3.0, 10.0)) -> list[Fault]:
    """The faults of a soak: one every ``gap`` seconds (uniform), each of a kind picked at
    random, from ``seed`` alone."""
    rng = random.Random(seed)
    out, at = [], rng.uniform(*gap)
    while at < duration:
        out.append(Fault(round(at, 3), rng.choice(kinds), rng.randrange(1 << 30), round(rng.uniform(*hold), 3)))
        at += rng.uniform(*gap)
    return out


@dataclass
class Switch:
    model: str            # namespace/name
    action: str
    start: float          # seconds after the soak began
    to: str = ""          # target digest ("" for a scale change)
    replicas: int = 0     # the model's replicas then (a scale change: those asked for)
    before: str = ""      # lastTransition.id before the change
    staged_at: float | None = None   # a staged switch: when spec.bundle was set
    end: float | None = None
    result: str = ""      # succeeded, failed-and-rolled-back, stuck
    strategy: str = ""    # lastTransition's, once it ended
    prestaged: bool = False
    reason: str = ""


@dataclass
class Injected:
    fault: Fault
    target: str           # what it hit: a Pod, a node, the source
    affects: list[str]    # models that lost an owner by it
    start: float
    sole: list[str] = field(default_factory=list)   # of those, models it left with no running owner
    slots: list[str] = field(default_factory=list)  # the owners it took, as "<model>#<slot>"
    store: str = ""       # a node store it filled: recovered once GC took it back under its high watermark
    container: str = ""   # a system container it killed: recovered once the API server names another
                          # (an operator's, with leader election: once the Lease is renewed after it)
    cleared: float | None = None
    recovered: float | None = None   # back at full strength, but for what the soak's own switches take away
    whole: float | None = None       # every model in scope at full strength, switches or not
    phases: dict[str, Any] = field(default_factory=dict)   # a powered-off node's return, step by step
    held: dict[str, list[float]] = field(default_factory=dict)  # what kept it from recovering: [first, last] seen
    error: str = ""


@dataclass
class SoakModel:
    story: Story
    replicas: int
    load: ClosedLoop | None = None
    seen: int = 0          # answers already looked at for failures

    @property
    def key(self) -> str:
        return f"{self.story.namespace}/{self.story.name}"


class Soak:
    def __init__(self, cluster, installation, server, revisions: list[str], seed: int, duration: float,
                 models: int = 4, clients: int = 1, gap: tuple[float, float] = (10.0, 30.0),
                 kinds: tuple[str, ...] | None = None, isolated: bool = False,
                 store_high_bytes: int | None = None, log: Callable[[str], None] = print):
        self.cluster, self.installation, self.server = cluster, installation, server
        self.revisions, self.seed, self.duration = revisions, seed, duration
        self.isolated = isolated
        self.clients, self.log = clients, log
        several = len(cluster.nodes) > 1
        self.store_high = store_high_bytes   # the bridges' GC high watermark, when the soak installed one
        self.kinds = kinds or (ONE_NODE_FAULTS + (NODE_FAULTS if several else ())
                               + (STORE_FAULTS if store_high_bytes else ()))
        self.plan = schedule(seed, duration, self.kinds, gap)
        self.max_replicas = 3 if several else 2
        self.models = [SoakModel(Story(cluster, f"soak-{i}", f"m{i}", installation.bridge_root), 1 + i % 2)
                       for i in range(models)]
        self.rng = random.Random(seed + 1)     # the driver's choices
        self.switches: list[Switch] = []
        self.injected: list[Injected] = []
        self.endpoints: list[dict[str, Any]] = []   # the Service's endpoints when requests failed
        self.t0 = 0.0
        self.t0_wall = 0.0   # time.time() at t0: API timestamps in soak seconds
        api = cluster.api_client()
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    # -- the run -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._apply_models()
        for m in self.models:
            m.load = ClosedLoop(m.story.service_address(), m.story.name, clients=self.clients, max_tokens=4,
                                pause=CLIENT_PAUSE_SECONDS)
            m.load.__enter__()
        self.t0, self.t0_wall = time.monotonic(), time.time()
        self.log(f"soak: seed {self.seed}, {self.duration:.0f} s, {len(self.plan)} faults planned, "
                 f"{len(self.models)} models")
        chaos = threading.Thread(target=self._faults, name="soak-faults", daemon=True)
        chaos.start()
        try:
            next_change = self.rng.uniform(2, 6)
            while self.now() < self.duration:
                states = self._read_models()
                try:
                    self._follow_switches(states)
                    self._follow_recovery(states)
                    self._note_failures()
                    if self.now() >= next_change:
                        next_change = self.now() + self.rng.uniform(2, 6)
                        self._change(states)
                except Exception as e:   # the API server may be away (a fault): next tick
                    self.log(f"soak {self.now():7.1f}s: driver: {type(e).__name__}: {str(e)[:120]}")
                time.sleep(TICK_SECONDS)
        finally:
            self._stop.set()
            chaos.join(120)
        settled = self._settle()
        end = self.now()
        for m in self.models:
            m.load.__exit__(None, None, None)
        answers = {m.key: [(round(a.start - self.t0, 3), round(a.end - self.t0, 3), a.status,
                            a.retry_after, a.error[:120]) for a in m.load.answers] for m in self.models}
        return {"seed": self.seed, "duration_seconds": self.duration, "end_seconds": end,
                "isolated": self.isolated,
                "kinds": list(self.kinds), "nodes": [n.name for n in self.cluster.nodes],
                "models": {m.key: {"replicas_at_end": m.replicas} for m in self.models},
                "schedule": [asdict(f) for f in self.plan],
                "faults": [asdict(i) for i in self.injected],
                "switches": [asdict(s) for s in self.switches],
                "requests": {k: {"sent": len(v), "failed": [a for a in v if a[2] != 200]}
                             for k, v in answers.items()},
                "endpoints_at_failures": self.endpoints,
                "settled": settled, "leaks": self.leaks(), "left_after_delete": self.remove()}

    def _apply_models(self) -> None:
        base = self.revisions[0]
        for m in self.models:
            self.cluster.kubectl("create", "namespace", m.story.namespace)
            self.cluster.wait_for_service_account(m.story.namespace)
            body = model_body(m.story.name, self.server.url, base)
            body["spec"]["replicas"] = m.replicas
            m.story.apply(body)
        for m in self.models:
            m.story.wait(f"{m.replicas}/{m.replicas} ready", lambda rm, r=m.replicas: (
                (rm.get("status") or {}).get("ready") == f"{r}/{r}"
                and (rm["status"].get("bundle") or {}).get("digest") == base), timeout=300)
        for m in self.models:   # and reached through its Service: kube-proxy may lag the status
            wait_routed(m.story.service_address(), m.key)

    def _read_models(self) -> dict[str, dict]:
        out = {}
        for m in self.models:
            try:
                out[m.key] = m.story.get()
            except Exception as e:   # the API server may be briefly away: try again next tick
                self.log(f"soak {self.now():7.1f}s: reading {m.key}: {type(e).__name__}")
                break
        return out

    # -- switches ----------------------------------------------------------------------
    def _pending(self, key: str) -> Switch | None:
        return next((s for s in self.switches if s.model == key and s.end is None), None)

    def _change(self, states: dict[str, dict]) -> None:
        m = self.models[self.rng.randrange(len(self.models))]
        action = self.rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        target = self.rng.choice(self.revisions)
        rm = states.get(m.key)
        status = (rm or {}).get("status") or {}
        if rm is None or self._pending(m.key) or status.get("transition") \
                or (status.get("bundle") or {}).get("digest") != rm["spec"]["bundle"]["digest"]:
            return   # busy: the draws are made anyway, so the sequence does not depend on timing
        live = rm["spec"]["bundle"]["digest"]
        before = (status.get("lastTransition") or {}).get("id") or ""
        if action == "scale":
            n = m.replicas + 1 if m.replicas < self.max_replicas and (m.replicas == 1 or self.rng.random() < 0.5) \
                else m.replicas - 1
            self._patch(m, {"replicas": n})
            m.replicas = n
            self.switches.append(Switch(m.key, action, self.now(), replicas=n, before=before))
            return
        if action == "rollback":
            target = (status.get("previousBundle") or {}).get("digest") or target
        if action == "lockstep" and m.replicas < 2:
            action = "auto"
        if target == live:
            target = next(r for r in self.revisions if r != live)
        if action == "staged":
            self._patch(m, {"stage": {"source": self.server.url, "digest": target}})
        else:
            self._switch_spec(m, action, target)
        self.switches.append(Switch(m.key, action, self.now(), to=target, replicas=m.replicas, before=before))

    def _switch_spec(self, m: SoakModel, action: str, target: str, keep_stage: bool = False) -> None:
        spec: dict[str, Any] = {
            "bundle": {"source": self.server.url, "digest": target},
            "delivery": {"mode": "WholeBundle" if action == "reload" else "Auto"},
            "transition": {"strategy": "Reload" if action == "reload" else "Auto",
                           "commit": "Lockstep" if action == "lockstep" else "Rolling"}}
        if not keep_stage:
            spec["stage"] = None
        self._patch(m, spec)

    def _patch(self, m: SoakModel, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, m.story.namespace, "residentmodels",
                                                   m.story.name, {"spec": spec})

    def _follow_switches(self, states: dict[str, dict]) -> None:
        for s in [s for s in self.switches if s.end is None]:
            rm = states.get(s.model)
            if rm is None:
                continue
            m = next(m for m in self.models if m.key == s.model)
            status = rm.get("status") or {}
            if s.action == "scale":
                if status.get("ready") == f"{s.replicas}/{s.replicas}":
                    s.end, s.result = self.now(), "succeeded"
                elif self.now() - s.start > SWITCH_LIMIT_SECONDS:
                    s.end, s.result = self.now(), "stuck"
                continue
            if s.action == "staged" and s.staged_at is None:
                staged = condition(rm, "Staged")
                if (staged.get("status") == "True" and (status.get("stage") or {}).get("digest") == s.to) \
                        or self.now() - s.start > STAGE_WAIT_SECONDS:
                    self._switch_spec(m, s.action, s.to, keep_stage=True)
                    s.staged_at = self.now()
                continue
            last = status.get("lastTransition") or {}
            if (status.get("bundle") or {}).get("digest") == s.to and not status.get("transition"):
                s.end, s.result = self.now(), "succeeded"
                if last.get("to") == s.to:
                    s.strategy, s.prestaged = last.get("strategy") or "", bool(last.get("prestaged"))
            elif last.get("to") == s.to and last.get("id") != s.before and last.get("result") == "failed":
                s.end, s.result = self.now(), "failed-and-rolled-back"
                s.strategy, s.reason = last.get("strategy") or "", f"{last.get('reason')}: {last.get('message')}"
                committed = (status.get("bundle") or {}).get("digest")
                if committed:
                    self._switch_spec(m, "auto", committed)
            elif self.now() - s.start > SWITCH_LIMIT_SECONDS:
                s.end, s.result = self.now(), "stuck"
                s.reason = f"phase {status.get('phase')}, transition {bool(status.get('transition'))}"

    # -- faults ------------------------------------------------------------------------
    def _faults(self) -> None:
        """Make the planned faults in order. Isolated, each fault waits until the one before
        has recovered (at most ISOLATION_LIMIT_SECONDS), then its gap in the schedule, so a
        recovery time is that fault's alone; faults due after the duration are not made."""
        shift = 0.0
        for f in self.plan:
            while not self._stop.is_set() and self.now() < f.at + shift:
                time.sleep(0.1)
            if self._stop.is_set() or f.at + shift >= self.duration:
                return
            record = self._inject(f)
            if self.isolated:
                limit = time.monotonic() + ISOLATION_LIMIT_SECONDS
                while not self._stop.is_set() and record.recovered is None and time.monotonic() < limit:
                    time.sleep(0.1)
                shift = self.now() - f.at

    def _inject(self, f: Fault) -> Injected:
        record = Injected(f, target="", affects=[], start=self.now())
        with self._lock:
            self.injected.append(record)
        try:
            if f.kind in ("owner-deleted", "owner-stalled"):
                def pick():
                    pods = self._owner_pods()
                    pod, key = pods[f.pick % len(pods)]
                    return pod, pod.spec.containers[0].name, (key, pods)
                pod, container, (key, pods) = self._live(pick)
                record.target, record.affects = f"pod {pod.metadata.namespace}/{pod.metadata.name}", [key]
                record.slots = [_slot(pod, key)]
                record.sole = [key] if sum(1 for _, k in pods if k == key) == 1 else []
                self.log(f"soak {self.now():7.1f}s: {f.kind} {record.target}")
                if f.kind == "owner-deleted":
                    self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
                else:
                    with faults.frozen(container):
                        time.sleep(f.hold)
            elif f.kind in ("bridge-killed", "operator-killed"):
                component = f.kind.split("-")[0]

                def pick():
                    pods = [p for p in self.core.list_namespaced_pod(
                        self.installation.namespace, label_selector=f"app.kubernetes.io/component={component}").items
                            if p.status.container_statuses and p.status.phase == "Running"]
                    pods.sort(key=lambda p: p.metadata.name)
                    return pods[f.pick % len(pods)], component, None
                pod, container, _ = self._live(pick)
                record.target = f"pod {pod.metadata.name} on {pod.spec.node_name}"
                record.container = container
                self.log(f"soak {self.now():7.1f}s: {f.kind} {record.target}")
                faults.kill(container)
            elif f.kind in ("kubelet-killed", "containerd-killed"):
                node = self.cluster.nodes[f.pick % len(self.cluster.nodes)]
                record.target = f"node {node.name}"
                self.log(f"soak {self.now():7.1f}s: {f.kind} on {node.name}, back after {f.hold:.1f} s")
                if f.kind == "kubelet-killed":
                    node.restart_kubelet(f.hold)
                else:
                    node.containerd.restart(f.hold)
            elif f.kind in CONTROL_PLANE_FAULTS:
                record.target = "kube-apiserver" if f.kind == "apiserver-killed" else "etcd"
                self.log(f"soak {self.now():7.1f}s: {f.kind}, back after {f.hold:.1f} s")
                if f.kind == "apiserver-killed":
                    self.cluster.restart_apiserver(f.hold, sig=signal.SIGKILL)
                else:
                    self.cluster.restart_etcd(f.hold)
            elif f.kind == "store-filled":
                node = self.cluster.nodes[f.pick % len(self.cluster.nodes)]
                root = node.host_path(self.installation.bridge_root) / "store"
                record.target, record.store = f"store of {node.name}", str(root)
                before, after = self._fill_store(root)
                self.log(f"soak {self.now():7.1f}s: {f.kind} on {node.name}: {before >> 20} -> {after >> 20} MiB "
                         f"(high watermark {self.store_high >> 20} MiB)")
            elif f.kind == "source-down":
                record.target = "the bundle source"
                self.log(f"soak {self.now():7.1f}s: source down for {f.hold:.1f} s")
                self.server.outage(f.hold)
            elif f.kind in NODE_FAULTS:
                name = self.cluster.nodes[f.pick % len(self.cluster.nodes)].name
                record.target = f"node {name}"
                pods = self._owner_pods(running=False)   # a starting or draining owner dies with its node too
                record.affects = sorted({key for pod, key in pods if pod.spec.node_name == name})
                record.slots = sorted({_slot(pod, key) for pod, key in pods if pod.spec.node_name == name})
                record.sole = [k for k in record.affects if all(p.spec.node_name == name for p, key in pods if key == k)]
                self.log(f"soak {self.now():7.1f}s: {f.kind} {name} for {f.hold:.1f} s")
                if f.kind == "node-power-cut":
                    self.cluster.power_off(name)
                    time.sleep(f.hold)
                    record.phases["powered_on"] = self.now()
                    self.cluster.power_on(name)
                else:
                    self.cluster.cut(name)
                    time.sleep(f.hold)
                    self.cluster.reconnect(name)
        except Exception as e:    # a fault that could not be made is kept with its reason
            record.error = f"{type(e).__name__}: {e}"[:300]
            self.log(f"soak {self.now():7.1f}s: {f.kind} not made: {record.error}")
        record.cleared = self.now()
        return record

    def _fill_store(self, root: Path) -> tuple[int, int]:
        """Put a revision of random bytes no one uses into the node store at ``root``,
        beside the running bridge (the store is safe across processes), so that it holds a
        tenth more than its high watermark; returns its usage before and after. The bridge's
        GC must take it back under the watermark without touching what volumes lease."""
        from bundle.scan import build_manifest, write_manifest
        from bundle.sources.file import FileSource
        from bundle.store import Store
        store = Store(root)
        before = store.usage_bytes()
        size = max(1 << 20, self.store_high - before + self.store_high // 10)
        with tempfile.TemporaryDirectory(prefix="resident-soak-fill-") as work:
            with open(Path(work) / "filler.bin", "wb") as f:
                for left in range(size, 0, -(4 << 20)):
                    f.write(os.urandom(min(left, 4 << 20)))
            manifest = build_manifest(work)
            write_manifest(work, manifest)
            source = FileSource(f"file://{work}")
            try:
                store.materialize(manifest, source)
            finally:
                source.close()
        return before, store.usage_bytes()

    @staticmethod
    def _live(pick, wait: float = LIVE_CONTAINER_SECONDS):
        """``pick()`` -> (Pod, container name, extra) read again until the container's
        processes exist, then (Pod, its container ID, extra). Right after a restart the API
        server still names the container that died (the kubelet reports the new one later)."""
        deadline = time.monotonic() + wait
        while True:
            pod, name, extra = pick()
            cid = next((s.container_id for s in pod.status.container_statuses or []
                        if s.name == name and s.state and s.state.running), None)
            try:
                if cid is None:
                    raise LookupError(f"container {name} of {pod.metadata.name} is not running")
                faults.container_pids(cid)
                return pod, cid, extra
            except LookupError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _owner_pods(self, running: bool = True) -> list[tuple[client.V1Pod, str]]:
        """(Pod, model) of every owner whose containers run (a restarting one has no
        container to stop yet), or with ``running`` False of every owner Pod, in a stable order."""
        out = []
        for m in self.models:
            for p in sorted(m.story.owner_pods(), key=lambda p: p.metadata.name):
                if not running or p.metadata.deletion_timestamp is None and p.status.phase == "Running" \
                        and p.status.container_statuses and all(
                            c.container_id and c.state and c.state.running for c in p.status.container_statuses):
                    out.append((p, m.key))
        return out

    def _serving(self, m: SoakModel, rm: dict | None) -> tuple[int, set[str]]:
        """How many owners of ``m`` serve, and the slots of those that answer: the count is
        the fewer of those its status counts ready and of those that answer their readiness
        path themselves, at their Pod IP. The API server's word is not enough: after a
        node's power cut shorter than the node monitor's grace period, it says Ready of the
        node's owners until the restarted kubelet reports them, while their Pod IP refuses
        every connection."""
        ready = ((rm or {}).get("status") or {}).get("ready") or "0/0"
        counted = int(ready.split("/")[0]) if ready.split("/")[0].isdigit() else 0
        answering: set[str] = set()
        for p in m.story.owner_pods():
            port = next((c.container_port for c in p.spec.containers[0].ports or [] if c.name == "control"), None)
            if p.metadata.deletion_timestamp is not None or not p.status.pod_ip or port is None:
                continue
            try:
                if requests.get(f"http://{p.status.pod_ip}:{port}/readyz", timeout=1.0).status_code == 200:
                    answering.add(_slot(p, m.key))
            except requests.RequestException:
                pass
        return min(counted, len(answering)), answering

    def _switch_allowance(self, m: SoakModel) -> int:
        """The strength ``m`` keeps through a switch the driver made: all but one replica (a
        rolling reload takes one owner at a time; a one-replica reload answers 503), or all
        of them when no switch of it is under way (staging ahead is not a switch yet)."""
        s = self._pending(m.key)
        switching = s is not None and (s.action != "staged" or s.staged_at is not None)
        return m.replicas - 1 if switching else m.replicas

    def _under_watermark(self, root: str | Path) -> bool:
        """The store's content (its catalog's blobs, read-only) is at most the high watermark."""
        (used,), = db_rows(Path(root) / "store.db", "SELECT COALESCE(SUM(size), 0) FROM blobs") or [[0]]
        return used <= self.store_high

    def _system(self) -> tuple[list[str], set[str], float | None]:
        """What keeps the installation from being whole (nothing: it is), the IDs of its containers the API server
        names, and when an operator last renewed the leader Lease (this machine's clock,
        which the API server shares; None without leader election).

        Whole: every Pod Ready, but for the operator's where a Lease says who leads: then
        an operator must hold it, renewed within its duration, and a replica that is not
        Ready (a standby kubelet holds in its crash-loop back-off) costs nothing while
        another leads. Right after a kill the API server still names the dead container,
        Ready, until the kubelet notices: a killed one has recovered only once another is
        named (a killed operator: once the Lease is renewed after it, :meth:`_follow_recovery`)."""
        system = [p for p in self.core.list_namespaced_pod(self.installation.namespace).items
                  if p.metadata.deletion_timestamp is None]
        led = self._lease_renewed()
        counted = [p for p in system if led is None or
                   (p.metadata.labels or {}).get("app.kubernetes.io/component") != "operator"]
        unready = [f"pod {p.metadata.name} not Ready" for p in counted
                   if not any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        if led is not None and time.time() - led[0] > led[1]:
            unready.append("the operator Lease not renewed within its duration")
        return unready, {c.container_id for p in system for c in p.status.container_statuses or []}, \
            (led[0] if led else None)

    def _lease_renewed(self) -> tuple[float, float] | None:
        """(when, for how many seconds) the operator's leader Lease was last renewed by a
        holder; None when the installation elects no leader."""
        leases = client.CoordinationV1Api(self.core.api_client).list_namespaced_lease(
            self.installation.namespace).items
        for lease in leases:
            spec = lease.spec
            if lease.metadata.name.endswith("-operator") and spec and spec.holder_identity and spec.renew_time:
                return spec.renew_time.timestamp(), float(spec.lease_duration_seconds or 15)
        return None

    def _follow_recovery(self, states: dict[str, dict]) -> None:
        """A fault has recovered (``recovered``) when the system's Pods are Ready and every
        model it may have touched serves with all its replicas again, but for one while a
        switch the driver made of it is under way, and the owners' slots the fault took
        (``slots``) answer again; a slot the driver has since scaled away (its index at or
        above the model's replicas now) has nothing to come back to. With a switch under way
        at nearly every moment, waiting for every model to be whole measured the driver's
        switches more than the fault.
        When every model in its scope is whole, switches or not, is kept too (``whole``):
        the end of its failure window."""
        with self._lock:
            waiting = [i for i in self.injected if i.cleared is not None and i.whole is None]
        if not waiting:
            return
        try:
            unready, containers, led = self._system()
            if unready:
                for i in waiting:
                    self._held(i, *unready)
                return
            serving = {m.key: self._serving(m, states.get(m.key)) for m in self.models if m.key in states}
        except Exception:
            return   # the API server may be briefly away
        for i in waiting:
            scope = [m for m in self.models if not i.affects or m.key in i.affects]
            if any(m.key not in serving for m in scope):
                self._held(i, "a model in scope unread")
                continue
            if i.store and not self._under_watermark(i.store):
                self._held(i, "the store above its high watermark")
                continue
            if i.fault.kind == "operator-killed" and led is not None:
                # an operator leads again: the Lease renewed since the kill was over (by a
                # standby that took over, or the killed one back from its back-off)
                if led <= time.time() - (self.now() - i.cleared):
                    self._held(i, "the operator Lease not renewed since the kill")
                    continue
            elif i.container and i.container in containers:
                self._held(i, "the killed container still named")
                continue
            replicas = {m.key: m.replicas for m in scope}
            back = set().union(*(serving[m.key][1] for m in scope),
                               {s for s in i.slots if _scaled_away(s, replicas)})
            short = [f"{m.key} serves {serving[m.key][0]} of {m.replicas}" for m in scope
                     if serving[m.key][0] < self._switch_allowance(m)]
            if i.recovered is None and (set(i.slots) - back or short):
                self._held(i, *short, *(f"slot {s} not answering" for s in sorted(set(i.slots) - back)))
            elif i.recovered is None:
                i.recovered = self.now()
                if i.fault.kind == "node-power-cut":
                    i.phases.update(self._return_phases(i))
            if all(serving[m.key][0] >= m.replicas for m in scope):
                i.whole = self.now()
                i.recovered = i.recovered if i.recovered is not None else i.whole

    def _held(self, i: Injected, *reasons: str) -> None:
        """Note what keeps ``i`` from having recovered (once recovered, nothing more)."""
        if i.recovered is not None:
            return
        now = round(self.now(), 1)
        for reason in reasons:
            i.held.setdefault(reason, [now, now])[1] = now

    def _return_phases(self, i: Injected) -> dict[str, Any]:
        """Where a powered-off node's return spent its time, from what the API server keeps
        (one-second timestamps, in soak seconds): when the node's bridge was Ready again, and
        for each owner the fault took, when its sandbox was up (``PodReadyToStartContainers``),
        its container started, kubelet's probe found it Ready, and how many times kubelet
        could not mount its volume, and why (``FailedMount`` Events since the fault)."""
        def at(ts) -> float | None:
            return round(ts.timestamp() - self.t0_wall, 1) if ts else None

        def since(p: client.V1Pod, kind: str) -> float | None:
            c = next((c for c in p.status.conditions or [] if c.type == kind and c.status == "True"), None)
            return at(c.last_transition_time) if c else None

        node = i.target.removeprefix("node ")
        out: dict[str, Any] = {"node_ready": i.cleared, "owners": {}}
        try:
            bridge = self.core.list_namespaced_pod(
                self.installation.namespace, label_selector="app.kubernetes.io/component=bridge",
                field_selector=f"spec.nodeName={node}").items
            out["bridge_ready"] = since(bridge[0], "Ready") if bridge else None
            for m in self.models:
                for p in m.story.owner_pods():
                    slot = _slot(p, m.key)
                    if slot not in i.slots or p.spec.node_name != node:
                        continue
                    running = next((c.state.running for c in p.status.container_statuses or []
                                    if c.state and c.state.running), None)
                    events = self.core.list_namespaced_event(
                        p.metadata.namespace, field_selector=f"involvedObject.name={p.metadata.name}").items
                    failed = [e for e in events if e.reason == "FailedMount"
                              and (at(e.last_timestamp or e.event_time) or 0) >= i.start]
                    out["owners"][slot] = {
                        "sandbox": since(p, "PodReadyToStartContainers"),
                        "started": at(running.started_at) if running else None,
                        "ready": since(p, "Ready"),
                        "failed_mounts": sum(e.count or 1 for e in failed),
                        "mount_errors": sorted({(e.message or "")[:300] for e in failed})}
        except Exception as e:   # a breakdown that could not be read costs the soak nothing
            out["error"] = f"{type(e).__name__}: {e}"[:200]
        return out

    def _note_failures(self) -> None:
        """When a model's clients got new failed answers since the last tick while no fault
        that took one of its owners away is still unrecovered (those failures are expected),
        read its Service's EndpointSlices now: which owners kube-proxy was sending to, and
        whether they were ready, serving or terminating (what explains a failure afterwards)."""
        with self._lock:
            expected = {k for i in self.injected if i.whole is None for k in i.affects}
        for m in self.models:
            answers = m.load.answers[m.seen:]
            m.seen += len(answers)
            failed = [round(a.start - self.t0, 3) for a in answers if a.status != 200]
            if not failed or m.key in expected or len(self.endpoints) >= ENDPOINT_SNAPSHOTS:
                continue
            snapshot: dict[str, Any] = {"at": self.now(), "model": m.key, "failed_starts": failed}
            if any(a.status == 0 for a in answers):
                snapshot["unanswered_syns"] = self._unanswered_syns(m.load.address)
            try:
                slices = client.DiscoveryV1Api(self.core.api_client).list_namespaced_endpoint_slice(
                    m.story.namespace, label_selector=f"kubernetes.io/service-name={m.story.name}").items
                snapshot["endpoints"] = [
                    {"pod": e.target_ref.name if e.target_ref else "", "node": e.node_name,
                     "addresses": e.addresses, "ready": e.conditions.ready, "serving": e.conditions.serving,
                     "terminating": e.conditions.terminating}
                    for sl in slices for e in sl.endpoints or []]
            except Exception as e:   # the API server may be away (a fault): say so
                snapshot["error"] = f"{type(e).__name__}: {str(e)[:120]}"
            self.endpoints.append(snapshot)

    def _unanswered_syns(self, address: str) -> list[str] | str:
        """The Service gateway's conntrack entries for ``address`` (``ip:port``) still in
        SYN_SENT: where kube-proxy sent connections that got no answer. A SYN retried on
        such an entry goes to the same endpoint until the entry expires (120 s), whether
        that endpoint is still there or not; the entry outlives a 60 s client timeout."""
        ip, port = address.rsplit(":", 1)
        gateway = self.cluster.network.service_gateway
        try:
            out = subprocess.run([*gateway.enter(), "conntrack", "-L", "-p", "tcp", "--state", "SYN_SENT",
                                  "--orig-dst", ip, "--dport", port],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode:
                return f"conntrack: {out.stderr.strip()[:200]}"
            return [line for line in out.stdout.splitlines() if line.strip()][:20]
        except (OSError, subprocess.SubprocessError) as e:   # a reading that fails costs the soak nothing
            return f"{type(e).__name__}: {str(e)[:120]}"

    # -- the end -----------------------------------------------------------------------
    def _settle(self) -> dict[str, Any]:
        """Wait for every switch to end and every model to be at full strength on its spec."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            states = self._read_models()
            self._follow_switches(states)
            self._follow_recovery(states)
            if not [s for s in self.switches if s.end is None] and all(
                    _on_spec(states.get(m.key), m.replicas) for m in self.models):
                return {"seconds": self.now(), "ok": True}
            time.sleep(TICK_SECONDS)
        states = self._read_models()
        for s in self.switches:
            if s.end is None:
                s.end, s.result, s.reason = self.now(), "stuck", "not done when the soak ended"
        return {"seconds": self.now(), "ok": False,
                "models": {k: {"phase": (v.get("status") or {}).get("phase"),
                               "ready": (v.get("status") or {}).get("ready")} for k, v in states.items()}}

    def leaks(self) -> list[str]:
        """What is left that should not be: Pods beyond the replicas, BundleDeliveries,
        leases and publications of no live Pod or delivery, CSI mounts of no live Pod."""
        found: list[str] = []
        for m in self.models:
            rm = m.story.get()
            pods = m.story.owner_pods()
            running = [p for p in pods if p.metadata.deletion_timestamp is None]
            if not _on_spec(rm, m.replicas):
                found.append(f"{m.key}: not Ready on its spec ({(rm.get('status') or {}).get('phase')}, "
                             f"ready {(rm.get('status') or {}).get('ready')})")
            if len(running) != m.replicas or len(pods) != len(running):
                found.append(f"{m.key}: {len(running)} owner Pods for {m.replicas} replicas, "
                             f"{len(pods) - len(running)} terminating")
            for bd in self.custom.list_namespaced_custom_object(GROUP, VERSION, m.story.namespace,
                                                                "bundledeliveries")["items"]:
                if bd["spec"].get("podUID") not in {p.metadata.uid for p in running}:
                    found.append(f"{m.key}: BundleDelivery {bd['metadata']['name']} of a Pod that is gone")
        return found + self.node_leaks()

    def node_leaks(self) -> list[str]:
        """On every node: publications of a Pod that is gone, leases of no live volume or
        BundleDelivery, CSI mounts of a Pod that is gone. Live means anywhere in the
        cluster, not only the soak's: other models may share it."""
        found: list[str] = []
        live_pods = {p.metadata.uid for p in self.core.list_pod_for_all_namespaces().items
                     if p.metadata.deletion_timestamp is None}
        live_deliveries = {bd["metadata"]["uid"] for bd in self.custom.list_cluster_custom_object(
            GROUP, VERSION, "bundledeliveries")["items"]}
        for node in self.cluster.nodes:
            root = node.host_path(self.installation.bridge_root)
            pubs = db_rows(root / "bridge.db", "SELECT target_path, volume_dir, pod_uid FROM publications")
            volumes = {Path(v).name for _, v, _ in pubs}
            for target, _, uid in pubs:
                if uid not in live_pods:
                    found.append(f"{node.name}: publication {target} of a Pod that is gone")
            if self.store_high and not self._under_watermark(root / "store"):
                found.append(f"{node.name}: store above its high watermark ({self.store_high >> 20} MiB)")
            for holder, digest in db_rows(root / "store" / "store.db", "SELECT holder, digest FROM leases"):
                kind, _, name = holder.partition(":")
                if (kind == "volume" and name not in volumes) or (kind == "delivery" and name not in live_deliveries):
                    found.append(f"{node.name}: lease {holder} on {digest[:19]} of nothing live")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if "kubernetes.io~csi" in point and not any(uid in point for uid in live_pods):
                found.append(f"CSI mount {point} of a Pod that is gone")
        return found


    def remove(self) -> list[str]:
        """Delete the soak's models and namespaces; what is left of them after (API objects
        in their namespaces, and what :meth:`node_leaks` finds)."""
        for m in self.models:
            m.story.delete_and_wait_gone()
        left = []
        for m in self.models:
            for what, items in m.story.leftovers().items():
                if what in ("pods", "bundleDeliveries", "services") and items:
                    left.append(f"{m.key}: {what} {items} after the model was deleted")
        left += self.node_leaks()
        for m in self.models:
            self.core.delete_namespace(m.story.namespace)
        return left


def _slot(pod: client.V1Pod, model: str) -> str:
    return f"{model}#{(pod.metadata.labels or {}).get(SLOT_LABEL, '?')}"


def _scaled_away(slot: str, replicas: dict[str, int]) -> bool:
    """Whether a scale-down took ``slot`` (``<model>#<index>``): the operator keeps a
    model's slots 0 .. replicas-1, and ``replicas`` holds each model's count now."""
    model, _, index = slot.rpartition("#")
    return index.isdigit() and model in replicas and int(index) >= replicas[model]


def _on_spec(rm: dict | None, replicas: int) -> bool:
    status = (rm or {}).get("status") or {}
    return bool(rm) and status.get("phase") == "Ready" and status.get("ready") == f"{replicas}/{replicas}" \
        and (status.get("bundle") or {}).get("digest") == rm["spec"]["bundle"]["digest"] \
        and not status.get("transition") and status.get("observedGeneration") == rm["metadata"]["generation"]


# -- figures, from the record alone ---------------------------------------------------
def gateway_faults(raw: dict[str, Any]) -> set[int]:
    """Indexes (in ``raw["faults"]``) of node faults that took down the node carrying the
    machine's Service traffic, replayed from the record: it starts on the first node and
    moves, when that node goes down, to the first node not down then
    (``LocalCluster._going_down``); it does not move back."""
    gateway, hit = (raw.get("nodes") or [None])[0], set()
    node_faults = sorted((i["start"], n, i) for n, i in enumerate(raw["faults"])
                         if i["fault"]["kind"] in NODE_FAULTS and not i["error"])
    for start, n, i in node_faults:
        name = i["target"].removeprefix("node ")
        if name != gateway:
            continue
        hit.add(n)
        down = {j["target"].removeprefix("node ") for t, _, j in node_faults
                if t <= start and (j["cleared"] is None or j["cleared"] > start)}
        gateway = next((node for node in raw["nodes"] if node not in down), gateway)
    return hit


def attribute(raw: dict[str, Any], model: str, answer: list, gateways: set[int] | None = None) -> str:
    """What a failed request (start, end, status, retry_after, error) is put down to;
    ``gateways`` is :func:`gateway_faults` of ``raw`` (computed when not given)."""
    start, end, status, retry_after = answer[0], answer[1], answer[2], answer[3]
    for i in raw["faults"]:
        # a deleted owner drains (it answers until no request came for a second), so only
        # the deletion of a model's sole owner leaves its clients without an answer
        if model not in (i["sole"] if i["fault"]["kind"] == "owner-deleted" else i["affects"]):
            continue
        if start <= _window_end(raw, i) and end >= i["start"]:
            return "owner-lost"
    if status == 0:
        for n in gateway_faults(raw) if gateways is None else gateways:
            i = raw["faults"][n]
            if start <= i["cleared"] and end >= i["start"]:
                return "route-lost"
    if status == 503 and retry_after:
        for s in raw["switches"]:
            if s["model"] == model and s["strategy"] == "Reload" and s["replicas"] == 1 \
                    and s["end"] is not None and start <= s["end"] and end >= s["start"]:
                return "reload-503"
    return "defect"


def _window_end(raw: dict[str, Any], i: dict[str, Any]) -> float:
    """When a fault's effects end: every model in its scope whole again (records before
    ``whole`` was kept measured only that, as ``recovered``), or the soak's end."""
    end = i["whole"] if "whole" in i else i["recovered"]
    return end if end is not None else raw["end_seconds"]


def _spread(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "median": None, "p95": None, "max": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"n": len(ordered), "median": round(statistics.median(ordered), 3), "p95": round(p95, 3),
            "max": round(ordered[-1], 3)}


RETURN_STEPS = ("node_ready", "bridge_ready", "sandbox", "started", "ready", "recovered")


def return_steps(raw: dict[str, Any]) -> dict[str, dict[str, float | int | None]]:
    """A powered-off node's return, step by step: seconds from its power-on to its node
    Ready, its bridge Ready, and, for the last of the owners the fault took, its sandbox up,
    its container started, kubelet's probe finding it Ready and the soak finding it
    answering (``recovered``). Faults recorded before :meth:`Soak._return_phases` have none."""
    steps: dict[str, list[float]] = {k: [] for k in RETURN_STEPS}
    for i in raw["faults"]:
        phases = i.get("phases") or {}
        if "powered_on" not in phases or i["recovered"] is None:
            continue
        at = {"node_ready": phases.get("node_ready"), "bridge_ready": phases.get("bridge_ready"),
              "recovered": i["recovered"]}
        for step in ("sandbox", "started", "ready"):
            times = [o.get(step) for o in (phases.get("owners") or {}).values()]
            at[step] = max(times) if times and None not in times else None
        for step, t in at.items():
            if t is not None:
                steps[step].append(t - phases["powered_on"])
    return {k: _spread(v) for k, v in steps.items() if v}


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    switches = raw["switches"]
    results = {r: sum(1 for s in switches if s["result"] == r)
               for r in ("succeeded", "failed-and-rolled-back", "stuck")}
    failures: dict[str, int] = {"owner-lost": 0, "reload-503": 0, "route-lost": 0, "defect": 0}
    gateways = gateway_faults(raw)
    for model, r in raw["requests"].items():
        for answer in r["failed"]:
            failures[attribute(raw, model, answer, gateways)] += 1
    made = [i for i in raw["faults"] if not i["error"]]
    recovery: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {}
    for i in made:
        if i["recovered"] is not None:
            recovery.setdefault(i["fault"]["kind"], []).append(i["recovered"] - i["start"])
        if i.get("whole") is not None:
            whole.setdefault(i["fault"]["kind"], []).append(i["whole"] - i["start"])
    # a switch under a fault (begun before its window ends, ended after it began) against one clear of faults
    durations: dict[str, list[float]] = {"under_a_fault": [], "clear_of_faults": []}
    for s in switches:
        if s["result"] == "succeeded" and s["action"] != "scale":
            under = any(s["start"] <= _window_end(raw, i) and s["end"] >= i["start"] for i in made)
            durations["under_a_fault" if under else "clear_of_faults"].append(s["end"] - s["start"])
    kept_whole = all("whole" in i for i in raw["faults"])
    return {
        "seed": raw["seed"], "duration_seconds": raw["duration_seconds"],
        **({"isolated": raw["isolated"]} if "isolated" in raw else {}),   # records before the mode had none
        "faults": {"planned": len(raw["schedule"]), "made": len(made),
                   "not_made": len(raw["faults"]) - len(made),
                   "not_recovered": sum(1 for i in made if i["recovered"] is None),
                   "by_kind": {k: sum(1 for i in made if i["fault"]["kind"] == k) for k in raw["kinds"]}},
        "switches": {"attempted": len(switches), **results,
                     "by_action": {a: sum(1 for s in switches if s["action"] == a) for a in ACTIONS}},
        "requests": {"sent": sum(r["sent"] for r in raw["requests"].values()),
                     "failed": sum(len(r["failed"]) for r in raw["requests"].values()), **failures},
        "recovery_rule": ("lost slots back, switches allowed" if all("slots" in i for i in raw["faults"])
                          else "switches allowed" if kept_whole else "every model whole"),
        "recovery_seconds": {k: _spread(v) for k, v in sorted(recovery.items())},
        **({"whole_seconds": {k: _spread(v) for k, v in sorted(whole.items())}} if kept_whole else {}),
        **({"power_on_to_seconds": steps} if (steps := return_steps(raw)) else {}),
        "switch_seconds": {k: _spread(v) for k, v in durations.items()},
        "settled": raw["settled"]["ok"], "leaks": len(raw["leaks"]) + len(raw["left_after_delete"]),
    }
