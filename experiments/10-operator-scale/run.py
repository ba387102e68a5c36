"""Experiment 10: what many ResidentModels cost the operator, poll-driven vs event-driven.

A real control plane (etcd, kube-apiserver, controller-manager, scheduler; no node, so
owner Pods stay Pending) and the operator as its own process, under its own static token
user so the API server's audit log attributes every request to it. Arms:

- ``poll``: the operator as of commit ``POLL_COMMIT`` (two 1 s kopf timers per model, a
  full re-read of the model, its Pods and deliveries at every resync), unpacked from git
  into a temporary directory and run with its own defaults;
- ``retry``: the event-driven operator as of commit ``RETRY_COMMIT``, the last one whose
  models each retry a source that is down on their own backoff (for ``--source down``);
- ``list``: the event-driven operator as of commit ``LIST_COMMIT``, the last one whose
  passes LIST a model's Pods and BundleDeliveries from the API server (and list a waiting
  Pod's Events every 3 s), unpacked the same way;
- ``writes``: the event-driven operator as of commit ``WRITES_COMMIT``, the one
  ``creation-writes/`` measured (one status write and one Event per pass), unpacked the
  same way;
- ``budget``: the event-driven operator as of commit ``BUDGET_COMMIT``, the last one that
  gave every model a PodDisruptionBudget (since, only a model with more owners than
  ``maxUnavailable`` gets one), unpacked the same way;
- ``get``: the event-driven operator as of commit ``GET_COMMIT``, the last one whose
  passes GET their model (since, they start from the model watch's copy), unpacked the
  same way;
- ``event``: the operator of this checkout (one driver per model woken by watch events,
  passes that read Pods and deliveries from the watch cache, a slow safety resync, one
  cluster-wide sweep), with the per-model NetworkPolicy on as the chart deploys it
  (``CHART_SETTINGS``).

``--arms`` picks two or more (default ``poll,event``, the first runs' pair).

Per round and arm: a fresh namespace, the operator started, ``--models`` ResidentModels
created at once (8 client threads); *converge* is the time from the last create until
every model has status conditions, seen through a watch of the namespace's models
(``--observer poll``: a LIST of every model every 0.5 s, as the runs before 2026-12-06
saw it; at 3,000 models those LISTs were some 30 % of the API server's CPU); once the
operator has written nothing for 30 s, it is left alone for ``--settle`` seconds and we
record its CPU time (utime+stime from /proc), its RSS at the end, and its API requests in
that window (audit log, one entry per request, long watches included);
*creation writes per model* are its create, update, patch and delete requests from the
first create until the operator has written nothing for 30 s (at least 10 s after
convergence; the first runs waited exactly 10 s), divided by the model count (all its
requests of that window, reads too, by verb and resource, are kept beside them);
``apiserver_request_total`` over the same window is kept beside it (it includes the
controller-manager's and the scheduler's own traffic). Then the operator stops, the
models lose their finalizers and the namespace is deleted; the next sample starts once it
is gone (at 3,000 models the garbage collection of its children takes minutes, and would
otherwise run under the next sample). Arms alternate each round.

``--source down`` gives every model the same source, an http server that refuses every
connection (the outage of issue 27): converge is then the time until every model says
so in its conditions, and the settled window measures what waiting on it costs.

``python experiments/10-operator-scale/run.py [--rounds 5] [--models 300] [--settle 300]
[--arms list,event] [--source up|down] [--out DIR]`` (root not needed). ``verify.py`` recomputes summary.json from raw.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO))

import benchkit  # noqa: E402

POLL_COMMIT = "587e517"          # the last commit of the poll-driven operator
RETRY_COMMIT = "8419040"         # the last event-driven operator whose models retry a source alone
LIST_COMMIT = "5844fec"          # the last event-driven operator whose passes LIST children
WRITES_COMMIT = "bfd3e59"        # the operator creation-writes/ measured
BUDGET_COMMIT = "2161d4b"        # the last operator that gave every model a disruption budget
GET_COMMIT = "bc8e00b"           # the last operator whose passes GET their model
COMMITS = {"poll": POLL_COMMIT, "retry": RETRY_COMMIT, "list": LIST_COMMIT, "writes": WRITES_COMMIT,
           "budget": BUDGET_COMMIT, "get": GET_COMMIT, "event": None}   # None: this checkout
USER = "resident-operator"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
QUIET_SECONDS = 30.0     # no write of the operator's this long: the creation is over
METRICS = ("requests_per_model_minute", "cpu_fraction", "rss_mib", "converge_seconds",
           "creation_writes_per_model")
CHART_SETTINGS = {"RESIDENT_OWNER_NETWORK_POLICY": "true", "RESIDENT_OPERATOR_NAMESPACE": "resident-system",
                  "RESIDENT_OPERATOR_POD_LABELS": "app.kubernetes.io/name=resident-operator"}
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["%s"]
  - level: None
""" % USER


def arms_of(raw: dict) -> list[str]:
    return sorted({s["arm"] for s in raw["samples"]}, key=list(COMMITS).index)


def recompute(raw: dict) -> dict:
    """Per metric the samples hold (the first runs counted no creation writes): each arm's
    median and IQR, and every other arm over ``event``."""
    ratios = {f"{a}_over_event": (a, "event") for a in arms_of(raw) if a != "event"}
    return {m: benchkit.summarize(raw["samples"], m, ratios) for m in METRICS
            if all(m in s for s in raw["samples"])}


PANELS = {"requests_per_model_minute": "API requests per model and minute",
          "cpu_fraction": "CPU, settled (fraction of one core)",
          "rss_mib": "RSS at the end, MiB",
          "converge_seconds": "last create to all with conditions, s",
          "creation_writes_per_model": "writes per model, creation"}


def draw(raw: dict, folder: Path) -> list[Path]:
    """cost.png: each metric of the summary per arm, median and IQR (raw.json holds one
    model count, so the picture compares the arms at that count, not across counts)."""
    import plots
    summary = recompute(raw)
    arms = arms_of(raw)
    n = summary[METRICS[0]]["arms"]["event"]["n"]
    named = ", ".join(f"{a} ({COMMITS[a]})" for a in arms if COMMITS[a])
    return [plots.medians(
        folder / "cost.png",
        f"10: {raw['config']['models']} models: " + (f"{named} vs this operator (event)" if named
                                                      else "this operator (event)"),
        [(PANELS[m], {arm: summary[m]["arms"][arm] for arm in arms}) for m in summary],
        plots.footnote(raw, f"n = {n} per arm, alternating; bars: medians, whiskers: IQR; "
                            f"settled window {raw['config']['settle_seconds']:.0f} s"))]


def operator_tree(work: Path, arm: str) -> Path:
    """The ``operator/`` folder an arm runs: this checkout's, or its commit's unpacked."""
    commit = COMMITS[arm]
    if commit is None:
        return REPO / "operator"
    dest = work / f"operator-{commit}"
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "operator"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "operator"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(cp, operator: subprocess.Popen) -> dict[str, float]:
    """CPU seconds so far of the operator and of each control-plane process: where a
    convergence's time goes (etcd, kube-apiserver, ... or the operator itself)."""
    procs = {name: p.pid for name, p in cp.processes.children} | {"operator": operator.pid}
    return {name: cpu_seconds(pid) for name, pid in procs.items()}


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def audited_requests(cp, since: float, until: float, verbs: set[str] | None = None) -> Counter:
    """Requests by USER received in [since, until) (epoch seconds), by ``verb
    resource[/subresource]``; only those of ``verbs`` if given."""
    from localcluster.controlplane import audited_request
    return Counter(audited_request(e) for e in cp.audit_entries(since, until) if by_operator(e, verbs))


def by_operator(entry: dict, verbs: set[str] | None = None) -> bool:
    """Whether an audit entry is a request of USER's (and of ``verbs``, if given)."""
    return (entry.get("user") or {}).get("username") == USER and (not verbs or entry.get("verb") in verbs)


def apiserver_requests(cp) -> float:
    req = urllib.request.Request(f"{cp.server}/metrics", headers={"Authorization": f"Bearer {cp.token}"})
    with urllib.request.urlopen(req, context=cp.ssl_context(), timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{"))


def model(name: str, bundle: dict) -> dict:
    return {"apiVersion": "resident.dev/v1alpha1", "kind": "ResidentModel", "metadata": {"name": name},
            "spec": {"bundle": bundle}}


def unreachable_bundle() -> dict:
    """A source that is down: an http server on a loopback port nobody listens on (taken
    and closed at once), so every read is refused (issue 27's outage)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"source": f"http://127.0.0.1:{port}/bundles/lm", "digest": "sha256:" + "0" * 64}


def tiny_bundle(work: Path) -> dict:
    """A real (tiny) bundle: the operator reads its manifest before it places a model."""
    from bundle.cpu_model import make_demo
    return {"source": f"file://{work / 'bundle'}",
            "digest": make_demo(work / "bundle", 256 * 1024, seed=1).digest}


def where_time_goes(pid: int, seconds: float, work: Path, top: int = 25) -> dict:
    """py-spy's samples of the running operator ``pid`` for ``seconds`` (100 a second, of
    threads that run, not of idle ones, without stopping it): the functions where those
    samples were (``self``) and those on their stacks (``inclusive``), each as a share of
    all samples, the ``top`` of each. A process apart, by default after the measured window
    (the sampling costs the operator a little, and the window's CPU figure stays clean of
    it); with ``--profile-at converge`` while the models converge, which it slows a little."""
    out = work / f"profile-{pid}.txt"
    beside = Path(sys.executable).parent / "py-spy"   # the venv's, when run as .venv/bin/python
    done = subprocess.run([str(beside) if beside.exists() else "py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)),
                           "--rate", "100", "--nonblocking", "--format", "raw", "--output", str(out)],
                          capture_output=True, text=True)
    if done.returncode or not out.exists():
        raise RuntimeError(f"py-spy failed: {done.stderr.strip()[-500:]}")
    own, inclusive, total = Counter(), Counter(), 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]   # lines apart: one function
        total += int(count)
        own[frames[-1]] += int(count)
        for f in set(frames):
            inclusive[f] += int(count)
    out.unlink()
    share = lambda c: {f: round(n / total, 4) for f, n in c.most_common(top)}   # noqa: E731
    return {"seconds": seconds, "samples": total, "self": share(own), "inclusive": share(inclusive)}


def apiserver_profile(cp, seconds: float, work: Path, top: int = 60) -> dict:
    """kube-apiserver's own CPU profile over the next ``seconds`` (Go's pprof at
    ``/debug/pprof/profile``, on by default, read with the admin token; ``go tool pprof``
    reads it): the functions where its samples were (``self``) and those on their stacks
    (``inclusive``), each as a share of all samples, the ``top`` of each, and the CPU
    seconds sampled. Where the API server's time goes while models converge."""
    out = work / f"apiserver-{time.monotonic_ns()}.pprof"
    req = urllib.request.Request(f"{cp.server}/debug/pprof/profile?seconds={int(seconds)}",
                                 headers={"Authorization": f"Bearer {cp.token}"})
    with urllib.request.urlopen(req, context=cp.ssl_context(), timeout=seconds + 60) as resp:
        out.write_bytes(resp.read())
    try:
        return {"seconds": seconds, **{part: pprof_top(out, flag, top)
                                       for part, flag in (("self", "-flat"), ("inclusive", "-cum"))}}
    finally:
        out.unlink()


def pprof_top(profile: Path, order: str, top: int) -> dict:
    """``go tool pprof -top``'s table (ordered by ``order``) as {function: share of all samples}
    plus ``cpu_seconds``: the profile's total."""
    text = subprocess.run(["go", "tool", "pprof", "-top", order, f"-nodecount={top}", str(profile)],
                          check=True, capture_output=True, text=True).stdout
    total = re.search(r"Duration: .*?Total samples = ([\d.]+)(m?s)", text)
    shares = {}
    for line in text.splitlines():
        # flat  flat%  sum%  cum  cum%  function
        cols = line.split(None, 5)
        if len(cols) == 6 and cols[1].endswith("%") and cols[4].endswith("%"):
            shares[cols[5]] = float((cols[1] if order == "-flat" else cols[4]).rstrip("%")) / 100
    return {"cpu_seconds": float(total.group(1)) / (1000 if total.group(2) == "ms" else 1) if total else None,
            "shares": shares}


def one_round(cp, work: Path, arm: str, models: int, settle: float, index: int, bundle: dict,
              profile: float = 0.0, server_profile: float = 0.0, observer: str = "watch",
              profile_at: str = "settled") -> dict:
    from kubernetes import client

    api = cp.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"scale-{arm}-{index}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    kubeconfig = work / f"{USER}.kubeconfig"
    cp.write_kubeconfig(str(kubeconfig), cp.user_tokens[USER][0], USER)
    tree = operator_tree(work, arm)
    # the kubeconfig verifies the API server against the control plane's CA, as every client does.
    # The per-model NetworkPolicy is on, as the chart deploys it (the poll arm predates it).
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "RESIDENT_OWNER_IMAGE": "resident-owner:bench",
           "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)]), **CHART_SETTINGS}
    log = open(work / f"operator-{arm}-{index}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "resident_operator", "-n", ns, "--metrics-port", "0"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(work))
    try:
        time.sleep(3)   # kopf is up and watching an empty namespace
        tail = AuditTail(cp.audit_log)
        watched = ConditionsWatch(custom, ns, models) if observer == "watch" else None
        created, cpu_created = time.time(), cpu_by_process(cp, proc)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: custom.create_namespaced_custom_object(
                "resident.dev", "v1alpha1", ns, "residentmodels", model(f"m{i:04d}", bundle)), range(models)))
        applied = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            server_profiled = pool.submit(apiserver_profile, cp, server_profile, work) if server_profile else None
            profiled = (pool.submit(where_time_goes, proc.pid, profile, work)
                        if profile and profile_at == "converge" else None)
            converged = watched.wait(applied + 600) if watched else poll_conditions(custom, ns, models, applied + 600)
            converge = max(0.0, converged - applied)
            cpu_converged = cpu_by_process(cp, proc)
            server_profiled = server_profiled.result() if server_profiled else None
            profiled = profiled.result() if profiled else None
        quiet = wait_for_quiet(tail)   # the creation's writes are over before the settled window
        creation = audited_requests(cp, created, time.time())
        writes = Counter({k: n for k, n in creation.items() if k.split(" ", 1)[0] in WRITES})
        t0, cpu0, req0 = time.time(), cpu_seconds(proc.pid), apiserver_requests(cp)
        time.sleep(settle)
        t1, cpu1, req1 = time.time(), cpu_seconds(proc.pid), apiserver_requests(cp)
        rss = rss_mib(proc.pid)
        settled = audited_requests(cp, t0, t1)
        own = settled.total()
        if profile and profile_at == "settled":
            profiled = where_time_goes(proc.pid, profile, work)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    for m in custom.list_namespaced_custom_object("resident.dev", "v1alpha1", ns, "residentmodels")["items"]:
        custom.patch_namespaced_custom_object("resident.dev", "v1alpha1", ns, "residentmodels",
                                              m["metadata"]["name"], {"metadata": {"finalizers": None}})
    core.delete_namespace(ns)
    deleted = time.monotonic()   # its children go before the next sample starts
    benchkit.wait_until(f"namespace {ns} gone", lambda: not namespace_exists(core, ns), timeout=900, every=1)
    minutes = (t1 - t0) / 60
    return {"converge_seconds": converge, "settle_seconds": t1 - t0, "cpu_fraction": (cpu1 - cpu0) / (t1 - t0),
            "rss_mib": rss, "operator_requests": own, "requests_per_model_minute": own / models / minutes,
            "apiserver_requests_total_delta": req1 - req0, "creation_writes_per_model": writes.total() / models,
            "creation_writes_by_request": {k: n / models for k, n in sorted(writes.items())},
            "creation_requests_by_request": dict(sorted(creation.items())),
            "settled_requests_by_request": dict(sorted(settled.items())),
            "converge_cpu_seconds": {k: cpu_converged[k] - cpu_created[k] for k in cpu_created},
            "namespace_gone_seconds": time.monotonic() - deleted, "quiet_after_converge_seconds": quiet,
            **({"profile": profiled} if profiled else {}),
            **({"apiserver_profile": server_profiled} if server_profiled else {})}


def has_conditions(model: dict) -> bool:
    """Whether a ResidentModel has status conditions: converged, for this experiment."""
    return bool((model.get("status") or {}).get("conditions"))


class ConditionsWatch:
    """When every one of ``models`` ResidentModels of ``ns`` has status conditions, seen
    through a watch started now (before the creates): the API server sends this observer
    each change once. The runs before 2026-12-06 polled instead (``poll_conditions``)."""

    def __init__(self, custom, ns: str, models: int) -> None:
        from kubernetes import watch
        version = custom.list_namespaced_custom_object("resident.dev", "v1alpha1", ns, "residentmodels"
                                                       )["metadata"]["resourceVersion"]
        self.models, self.at, self.failed = models, None, None
        self.stream = watch.Watch()
        self.thread = threading.Thread(target=self._follow, args=(custom, ns, version), daemon=True)
        self.thread.start()

    def _follow(self, custom, ns: str, version: str) -> None:
        have: set[str] = set()
        try:
            for event in self.stream.stream(custom.list_namespaced_custom_object, "resident.dev", "v1alpha1",
                                            ns, "residentmodels", resource_version=version):
                if event["type"] == "ERROR":
                    raise RuntimeError(f"the watch ended: {event['object']}")
                body = event["object"]
                name = body["metadata"]["name"]
                if event["type"] != "DELETED" and has_conditions(body):
                    have.add(name)
                else:
                    have.discard(name)
                if len(have) == self.models:
                    self.at = time.monotonic()
                    return
        except Exception as e:   # noqa: BLE001 - told to wait()
            self.failed = e
        finally:
            self.stream.stop()

    def wait(self, deadline: float) -> float:
        """The monotonic time the last model got conditions."""
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.failed:
            raise self.failed
        if self.at is None:
            self.stream.stop()
            raise TimeoutError("not every model has conditions within 600 s of the last create")
        return self.at


def poll_conditions(custom, ns: str, models: int, deadline: float) -> float:
    """The first runs' observer: LIST every model every 0.5 s until all have conditions
    (at 3,000 models each LIST is every model's whole object, encoded by the API server and
    decoded here, twice a second: the observer's own load in the measured window)."""
    while True:
        items = custom.list_namespaced_custom_object("resident.dev", "v1alpha1", ns, "residentmodels")["items"]
        if sum(1 for m in items if has_conditions(m)) == models:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError("not every model has conditions within 600 s of the last create")
        time.sleep(0.5)


class AuditTail:
    """The audit log read from where it ended last time: cheap to poll, where reading the
    whole log (GBs at 3,000 models) is not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_writes(self) -> int:
        """USER's writes logged since the last call (complete lines only)."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return sum(by_operator(json.loads(line), WRITES) for line in complete.splitlines())


def wait_for_quiet(tail: AuditTail, quiet: float = QUIET_SECONDS, limit: float = 900.0, every: float = 5.0) -> float:
    """Wait until the operator has written nothing for ``quiet`` seconds (at least 10 s
    in all, as the first runs waited); return the seconds waited. At 300 models its writes
    end within the 10 s; at 3,000 the scheduler's verdicts keep its status writes coming
    for minutes after every model has conditions."""
    start = last_write = time.monotonic()
    while True:
        time.sleep(every)
        now = time.monotonic()
        if tail.new_writes():
            last_write = now
        elif now - last_write >= quiet and now - start >= 10:
            return now - start
        if now - start > limit:
            raise TimeoutError(f"the operator still writes {limit:.0f} s after converging")


def namespace_exists(core, name: str) -> bool:
    from kubernetes.client.rest import ApiException
    try:
        core.read_namespace(name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--settle", type=float, default=300.0, help="settled window per sample, seconds")
    ap.add_argument("--out", type=Path, default=HERE, help="where raw.json and summary.json go")
    ap.add_argument("--arms", default="poll,event",
                    help=f"comma-separated, of {', '.join(COMMITS)} (event: this checkout); event alone "
                         "measures this operator against absolute targets (e.g. --models 3000)")
    ap.add_argument("--source", choices=("up", "down"), default="up",
                    help="down: every model's one source refuses connections (issue 27's outage; "
                         "with --arms retry,event: a retry loop per model against one probe per source)")
    ap.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                    help="after each settled window, sample the operator this long with py-spy "
                         "(in the test extra) and keep where its time went in raw.json; "
                         "with fewer than 5 rounds a diagnosis, not a benchmark: one sample per arm, "
                         "written to profile.json")
    ap.add_argument("--profile-at", choices=("settled", "converge"), default="settled",
                    help="when --profile samples the operator: after the settled window (default), or "
                         "from the last create, while the models converge")
    ap.add_argument("--apiserver-profile", type=float, default=0.0, metavar="SECONDS",
                    help="from the last create, take kube-apiserver's CPU profile (Go pprof) this long "
                         "and keep where its time went (go tool pprof -top) in raw.json")
    ap.add_argument("--observer", choices=("watch", "poll"), default="watch",
                    help="how the run sees every model get conditions: a watch (default), or a LIST "
                         "every 0.5 s (the runs before 2026-12-06)")
    args = ap.parse_args(argv)
    # with a profile and fewer than 5 rounds: one sample per arm, profile.json, no summary
    diagnosis = bool(args.profile or args.apiserver_profile) and args.rounds < 5
    arms = args.arms.split(",")
    if "event" not in arms or not set(arms) <= set(COMMITS) or len(set(arms)) != len(arms):
        ap.error(f"--arms: of {', '.join(COMMITS)}, event among them")

    from localcluster.controlplane import ControlPlane

    work = Path(tempfile.mkdtemp(prefix="resident-exp10-"))
    machine_before = benchkit.machine()
    try:  # the audit log grows to GBs: removed also when a run fails
        with ControlPlane(state_dir=work / "cp", audit_policy=AUDIT_POLICY,
                          extra_users={USER: "system:masters"}) as cp:
            cp.install_crds()
            kubernetes_version = cp.version
            counter = iter(range(1000))
            bundle = tiny_bundle(work) if args.source == "up" else unreachable_bundle()
            rounds = {arm: (lambda arm=arm: one_round(cp, work, arm, args.models, args.settle, next(counter),
                                                      bundle, args.profile, args.apiserver_profile,
                                                      args.observer, args.profile_at))
                      for arm in arms}
            if diagnosis:
                samples = [{"round": 0, "arm": arm, **take()} for arm, take in rounds.items()]
            else:
                samples = benchkit.run_rounds(args.rounds, rounds)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    raw = {"config": {"rounds": args.rounds, "models": args.models, "settle_seconds": args.settle,
                      "source": args.source, "profile_seconds": args.profile, "profile_at": args.profile_at,
                      "apiserver_profile_seconds": args.apiserver_profile, "observer": args.observer,
                      "poll_commit": POLL_COMMIT, "commits": {a: COMMITS[a] for a in arms},
                      "kubernetes": kubernetes_version},
           **benchkit.provenance(machine_before, benchkit.machine()), "samples": samples}
    args.out.mkdir(parents=True, exist_ok=True)
    if diagnosis:
        (args.out / "profile.json").write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
        for sample in samples:
            for what, parts in (("operator", sample.get("profile")),
                                ("kube-apiserver", sample.get("apiserver_profile"))):
                for part in ("self", "inclusive") if parts else ():
                    shares = parts[part]["shares"] if what == "kube-apiserver" else parts[part]
                    print(f"{sample['arm']}, {what}, {part}:")
                    for where, share in shares.items():
                        print(f"  {share:6.1%}  {where}")
        return 0
    summary = recompute(raw)
    benchkit.write(args.out, raw, summary, draw)
    for m, s in summary.items():
        medians = "  ".join(f"{a} {s['arms'][a]['median']:10.3f}" for a in arms)
        ratios = "  ".join(f"{k} {'-' if r is None else f'{r:.2f}x'}" for k, r in s["ratios"].items())
        print(f"{m:<28} {medians}  {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
