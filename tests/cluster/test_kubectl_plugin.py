"""``kubectl resident`` against the real API server: the console script that pyproject.toml
registers, run as a process with a kubeconfig, as kubectl would run it from PATH.

The test plays the operator: it writes the model's status and Events as admin."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from chart_accounts import service_account_token
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "resident.dev", "v1alpha1", "residentmodels"
OLD, NEW = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
MODEL = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResidentModel", "metadata": {"name": "llm"},
         "spec": {"replicas": 2, "bundle": {"source": "file:///srv/bundles/llm", "digest": NEW}}}
STARTED = time.time() - 30
STATUS = {
    "phase": "Transitioning", "ready": "1/2", "bundle": {"digest": OLD, "source": "file:///srv/bundles/llm"},
    "owners": [
        {"pod": "llm-owner-0-1", "uid": "u0", "slot": 0, "ready": True, "phase": "Running", "node": "node-a",
         "state": "ready", "identity": {"bundle": NEW}},
        {"pod": "llm-owner-1-1", "uid": "u1", "slot": 1, "ready": False, "phase": "Running", "node": "node-b",
         "state": "transitioning", "identity": {"bundle": OLD}}],
    "transition": {"id": "t-2", "from": OLD, "to": NEW, "toSource": "file:///srv/bundles/llm",
                   "strategy": "InPlace", "path": "GraphOnly", "startedAt": STARTED, "owners": [
                       {"slot": 0, "pod": "llm-owner-0-1", "podUID": "u0", "node": "node-a", "step": "Done",
                        "bytes": {"fetched": 3 * 2**20, "reused": 5 * 2**30, "written": 3 * 2**20}},
                       {"slot": 1, "pod": "llm-owner-1-1", "podUID": "u1", "node": "node-b",
                        "step": "Delivering", "bytes": {"fetched": 2**20}}]},
    "conditions": [{"type": "Transitioning", "status": "True", "reason": "TransitionInProgress",
                    "message": "1/2 owners on the target", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    "lastTransition": {"id": "t-1", "from": "sha256:" + "99" * 32, "to": OLD, "strategy": "Reload",
                       "path": "WholeBundle", "method": "reload", "result": "succeeded", "owners": 2, "replaced": 0,
                       "bytes": {"fetched": 7 * 2**30, "reused": 0, "written": 7 * 2**30},
                       "nodes": [{"node": "node-a", "owners": 1, "fetched": 7 * 2**29, "reused": 0,
                                  "written": 7 * 2**29}],
                       "durations": {"deliverSeconds": 61.5, "applySeconds": 12.25, "firstTokenSeconds": 0.5,
                                     "totalSeconds": 80.0}},
}


def entry_point() -> list[str]:
    """The command pyproject.toml installs as ``kubectl-resident`` (so its registration is tested)."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["kubectl-resident"]
    module, func = target.split(":")
    return [sys.executable, "-c", f"import sys; sys.argv[0] = 'kubectl-resident'; from {module} import {func}; {func}()"]


def env(kubeconfig: str | None = None) -> dict[str, str]:
    out = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'operator'}")
    out.pop("KUBECONFIG", None)
    if kubeconfig:
        out["KUBECONFIG"] = kubeconfig
    return out


def plugin(*args: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(entry_point() + list(args), env=env(kubeconfig), capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def custom(cluster):
    return client.CustomObjectsApi(cluster.api_client())


@pytest.fixture
def model(custom, namespace):
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, MODEL)
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "llm", {"status": STATUS})
    return created


def kubeconfig_in(cluster, namespace: str, tmp_path) -> str:
    """The admin kubeconfig whose current context names ``namespace`` (no -n needed)."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_get_shows_owners_nodes_revisions_steps_and_conditions(cluster, namespace, model, tmp_path):
    done = plugin("get", "llm", kubeconfig=kubeconfig_in(cluster, namespace, tmp_path))
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.startswith("  llm-owner")}
    assert rows["llm-owner-0-1"][:7] == ["llm-owner-0-1", "0", "node-a", "yes", "ready", NEW[:19], "Done"]
    assert rows["llm-owner-1-1"][:7] == ["llm-owner-1-1", "1", "node-b", "no", "transitioning", OLD[:19],
                                         "Delivering"]
    assert f"Namespace:   {namespace}" in done.stdout
    assert f"{OLD[:19]} -> {NEW[:19]}  strategy InPlace, path GraphOnly" in done.stdout
    assert "Transitioning  True    TransitionInProgress" in done.stdout
    assert "Last transition: succeeded" in done.stdout


def test_history_shows_last_transition_and_transition_events(cluster, namespace, model):
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_event(namespace, client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="llm."), reason="TransitionFailed", type="Warning",
        message="transition to sha256:000000000000 failed: Timeout: too slow", count=1,
        involved_object=client.V1ObjectReference(api_version=f"{GROUP}/{VERSION}", kind="ResidentModel",
                                                 name="llm", namespace=namespace,
                                                 uid=model["metadata"]["uid"])))
    done = plugin("history", "llm", "-n", namespace, "--kubeconfig", cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "t-1  succeeded" in out and "Reload    WholeBundle  reload" in out
    assert "actual  7.0 GiB  -           0 B     7.0 GiB" in out   # no bytes from peers recorded
    assert "1m02s    12.2s  0.5s" in out   # deliver, apply, first token
    assert "node-a  1       3.5 GiB" in out
    assert "TransitionFailed  1      transition to sha256:000000000000 failed: Timeout: too slow" in out


def test_watch_redraws_on_a_status_change_and_ctrl_c_exits_cleanly(cluster, namespace, model, custom):
    # PYTHONFAULTHANDLER: if it does not exit, SIGABRT makes it print where each thread is.
    # SIGINT back to its default, as in a user's terminal: a suite started as a background job
    # inherits it ignored, and Python then installs no KeyboardInterrupt handler at all.
    proc = subprocess.Popen(entry_point() + ["get", "llm", "-n", namespace, "--watch"],
                            env=dict(env(cluster.kubeconfig), PYTHONFAULTHANDLER="1"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    errors: list[str] = []   # read as it comes, so a full pipe can never block the plugin
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    stderr = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
    stderr.start()

    def wait_for(text: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if text in lines.get(timeout=0.2):
                    return
            except queue.Empty:
                assert proc.poll() is None, "".join(errors)
        pytest.fail(f"the watch never printed {text!r}")

    try:
        wait_for("Phase:       Transitioning")
        wait_for("Last transition:")   # the first view is complete: the watch starts after it
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "llm", {"status": {
            "phase": "Ready", "ready": "2/2", "transition": None}})
        wait_for("Phase:       Ready")
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)   # 10 s was too short once under the whole suite's load
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=10)
            stderr.join(timeout=5)
            pytest.fail("no exit 30 s after Ctrl-C; where it was:\n" + "".join(errors))
        stderr.join(timeout=5)
        assert code == 0, "".join(errors)
        assert "Traceback" not in "".join(errors)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_model_is_a_clear_error(cluster, namespace):
    done = plugin("get", "nope", "-n", namespace, kubeconfig=cluster.kubeconfig)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: residentmodel 'nope' not found in namespace {namespace!r} "
                                   "(context 'resident-local')")


def test_a_user_without_rbac_for_residentmodels_is_told_so(cluster, namespace, model, tmp_path):
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="nobody")))
    path = str(tmp_path / "nobody.kubeconfig")
    cluster.write_kubeconfig(path, service_account_token(core, namespace, "nobody"), "nobody")
    done = plugin("history", "llm", "-n", namespace, "--kubeconfig", path)   # reads as get does
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: forbidden: you cannot get residentmodels.resident.dev in "
                                  f"namespace {namespace!r}"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_no_api_server_is_a_clear_error(cluster, tmp_path):
    path = str(tmp_path / "gone.kubeconfig")
    cluster.write_kubeconfig(path, "token", "someone", server="https://127.0.0.1:1")
    done = plugin("get", "llm", kubeconfig=path)
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach the API server of context 'resident-local' at "
                                  "https://127.0.0.1:1"), done.stderr


# stage, switch, rollback: the plugin writes the spec; the test then writes the status as
# the operator would, and a --wait run must follow it to the end.

STAGED_SRC = "file:///srv/bundles/llm-v3"
NEXT = "sha256:" + "c3" * 32


def waiting(*args: str, kubeconfig: str) -> subprocess.Popen:
    return subprocess.Popen(entry_point() + list(args), env=env(kubeconfig), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def spec_of(custom, namespace: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm")["spec"]


def write_status(custom, namespace: str, status: dict) -> None:
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "llm", {"status": status})


def stage_status(states: list[str], cond: tuple[str, str, str]) -> dict:
    return {"stage": {"digest": NEXT, "ready": f"{states.count('Staged')}/{len(states)}",
                      "nodes": [{"node": f"node-{i}", "pod": f"llm-owner-{i}-1", "state": s}
                                for i, s in enumerate(states)]},
            "conditions": [{"type": "Staged", "status": cond[0], "reason": cond[1], "message": cond[2],
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}


def test_stage_sets_spec_stage_and_wait_follows_every_node_until_staged(cluster, namespace, model, custom):
    proc = waiting("stage", "llm", "-n", namespace, "--source", STAGED_SRC, "--digest", NEXT, "--wait",
                   kubeconfig=cluster.kubeconfig)
    try:
        wait_for(lambda: spec_of(custom, namespace).get("stage") == {"source": STAGED_SRC, "digest": NEXT,
                                                                   "preload": False},   # the CRD's default
                 timeout=15, what="spec.stage written", every=0.1)
        write_status(custom, namespace, stage_status(["Staged", "Staging"], ("False", "Staging", "1 of 2")))
        time.sleep(0.5)
        assert proc.poll() is None   # one node still stages: it waits
        write_status(custom, namespace, stage_status(["Staged", "Staged"], ("True", "Staged", "all 2")))
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == f"residentmodel 'llm': {NEXT[:19]} staged on 2/2 owners' nodes"
    assert "staging sha256:c3c3c3c3c3c3" in err and "2/2" in err   # the progress bar, on stderr

    cleared = plugin("stage", "llm", "-n", namespace, "--clear", kubeconfig=cluster.kubeconfig)
    assert cleared.returncode == 0, cleared.stderr
    assert "stage" not in spec_of(custom, namespace)


def test_stage_wait_ends_with_the_reason_when_a_node_fails(cluster, namespace, model, custom):
    proc = waiting("stage", "llm", "-n", namespace, "--source", STAGED_SRC, "--digest", NEXT, "--wait",
                   kubeconfig=cluster.kubeconfig)
    try:
        wait_for(lambda: "stage" in spec_of(custom, namespace), timeout=15, what="spec.stage written", every=0.1)
        write_status(custom, namespace, stage_status(["Staged", "Failed"], (
            "False", "StageFailed", "node node-1 (llm-owner-1-1): DigestMismatch: the bundle is sha256:0")))
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 1 and out == ""
    assert err.strip().endswith("error: node node-1 (llm-owner-1-1): DigestMismatch: the bundle is sha256:0")


def test_switch_to_the_staged_revision_with_lockstep_waits_for_the_commit(cluster, namespace, model, custom):
    write_status(custom, namespace, {"transition": None, "bundle": {"source": MODEL["spec"]["bundle"]["source"],
                                                                    "digest": NEW}})
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm", {
        "spec": {"stage": {"source": STAGED_SRC, "digest": NEXT}}})
    write_status(custom, namespace, stage_status(["Staged", "Staged"], ("True", "Staged", "all 2")))
    proc = waiting("switch", "llm", "-n", namespace, "--commit", "Lockstep", "--wait",
                   kubeconfig=cluster.kubeconfig)
    try:
        wait_for(lambda: spec_of(custom, namespace)["bundle"]["digest"] == NEXT, timeout=15,
                 what="spec.bundle written", every=0.1)
        spec = spec_of(custom, namespace)
        assert spec["bundle"] == {"source": STAGED_SRC, "digest": NEXT}
        assert spec["transition"]["commit"] == "Lockstep"
        write_status(custom, namespace, {"transition": {"id": "t-3", "from": NEW, "to": NEXT, "owners": [
            {"slot": 0, "pod": "llm-owner-0-1", "step": "Prepared"}, {"slot": 1, "pod": "llm-owner-1-1",
                                                                     "step": "Preparing"}]}})
        time.sleep(0.5)
        assert proc.poll() is None
        write_status(custom, namespace, {
            "transition": None, "bundle": {"source": STAGED_SRC, "digest": NEXT},
            "owners": [{"pod": f"llm-owner-{i}-1", "slot": i, "identity": {"bundle": NEXT}} for i in (0, 1)],
            "lastTransition": {"id": "t-3", "from": NEW, "to": NEXT, "result": "succeeded"}})
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == f"residentmodel 'llm': on {NEXT[:19]} (2/2 owners)"
    assert "note:" not in err   # staged on every node: nothing to deliver

    again = plugin("switch", "llm", "-n", namespace, kubeconfig=cluster.kubeconfig)
    assert again.returncode == 0 and again.stdout.strip() == f"residentmodel 'llm': already on {NEXT[:19]}"


def test_rollback_mid_switch_goes_back_to_the_committed_revision_and_reports_a_failure(
        cluster, namespace, model, custom):
    # the model fixture is mid-switch: OLD committed, NEW wanted
    proc = waiting("rollback", "llm", "-n", namespace, "--wait", kubeconfig=cluster.kubeconfig)
    try:
        wait_for(lambda: spec_of(custom, namespace)["bundle"]["digest"] == OLD, timeout=15,
                 what="spec.bundle back to OLD", every=0.1)
        write_status(custom, namespace, {"transition": None, "lastTransition": {
            "id": "t-3", "from": NEW, "to": OLD, "result": "failed", "reason": "Timeout",
            "message": "owner llm-owner-1-1 took longer than 300s"}})
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 1 and out == ""
    assert err.strip().endswith(f"error: the transition to {OLD[:19]} failed: Timeout: owner llm-owner-1-1 "
                                "took longer than 300s"), err


def test_switch_without_a_staged_revision_and_a_bad_digest_are_refused_without_a_write(
        cluster, namespace, model, custom):
    before = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm")
    done = plugin("switch", "llm", "-n", namespace, kubeconfig=cluster.kubeconfig)
    assert done.returncode == 1 and done.stderr.startswith("error: no revision is staged (spec.stage)")
    bad = plugin("stage", "llm", "-n", namespace, "--source", STAGED_SRC, "--digest", "sha256:short",
                 kubeconfig=cluster.kubeconfig)
    assert bad.returncode == 1 and bad.stderr.startswith("error: the API server refused the change:"), bad.stderr
    assert "spec.stage.digest" in bad.stderr
    half = plugin("switch", "llm", "-n", namespace, "--source", STAGED_SRC, kubeconfig=cluster.kubeconfig)
    assert half.returncode == 2 and "--source and --digest go together" in half.stderr
    after = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_change_made_meanwhile_is_not_overwritten(cluster, namespace, model, custom):
    from kubectl_resident import access, change
    t = access.connect("llm", namespace, cluster.kubeconfig, None)
    read = access.read_model(t)
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm", {
        "spec": {"stage": {"source": STAGED_SRC, "digest": NEXT}}})   # someone else, in between
    with pytest.raises(access.AccessError, match="changed after it was read .* nothing was written"):
        access.patch_model(t, change.stage_patch(read, change.Revision(STAGED_SRC, OLD)))
    assert spec_of(custom, namespace)["stage"]["digest"] == NEXT


def test_a_reader_who_may_not_patch_is_told_which_verb_to_ask_for(cluster, namespace, model, tmp_path):
    core = client.CoreV1Api(cluster.api_client())
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="reader")))
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="reader"), rules=[client.V1PolicyRule(
            api_groups=[GROUP], resources=[PLURAL], verbs=["get", "list", "watch"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="reader"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="reader"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)]))
    path = str(tmp_path / "reader.kubeconfig")
    cluster.write_kubeconfig(path, service_account_token(core, namespace, "reader"), "reader")
    assert plugin("get", "llm", "-n", namespace, "--kubeconfig", path).returncode == 0
    done = plugin("rollback", "llm", "-n", namespace, "--kubeconfig", path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: forbidden: you cannot patch residentmodels.resident.dev in "
                                  f"namespace {namespace!r}") and "granting patch on" in done.stderr, done.stderr
