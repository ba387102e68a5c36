"""A real single-node Kubernetes cluster on loopback: the local control plane plus containerd and
a kubelet, used by the end-to-end tests and the demo.

``with LocalCluster() as c:`` takes the machine-wide node lock, restores the machine if
an earlier run died before its teardown, records the host state
(:mod:`localcluster.teardown`), starts the control plane (:class:`ControlPlane` with
Node authorization), containerd (:mod:`localcluster.containerd`) with our pause image,
and the kubelet (:mod:`localcluster.kubelet`), then waits until the node is Ready and the
``default`` ServiceAccount has its token. Pods must use ``hostNetwork: true``: the only
CNI network is loopback. A process on the node reaches a hostNetwork Pod at
``127.0.0.1:<port>``; that is the explicit single-node setting the operator uses, never
the node's InternalIP.

:meth:`LocalCluster.stop` (also on exit, on SIGTERM and after a failed start) undoes it
all, in an order that lets every component clean up after itself: Pods are deleted first
and awaited, so kubelet unpublishes CSI volumes while the plugin still runs; then kubelet
stops; containerd's tasks are killed and its containers removed before containerd stops;
leftover shims are ended by PID; the control plane stops; finally the host record is
restored: mounts under ``/var/lib/kubelet`` unmounted deepest first, sysctls written
back, added iptables chains and kubepods cgroups removed.

One node per machine: the kubelet's root dir is ``/var/lib/kubelet`` (CSI plugins need
that path), so a second LocalCluster waits for the lock (``lock_timeout``) and then
fails with :class:`LocalClusterBusy`.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from .binaries import CONTROL_PLANE, NODE, apt_install, ensure_binaries
from .containerd import PACKAGES, ROOT as CONTAINERD_ROOT, STATE as CONTAINERD_STATE, Containerd
from .controlplane import ControlPlane
from .images import cached_image_names, pause_image, project_image
from .kubelet import ROOT_DIR as KUBELET_ROOT, default_node_name, kubelet_argv, kubelet_config
from .processes import ProcessGroup, free_port
from .drain import drain_pods
from .teardown import NODE_LOCK, RECORD, HostRecord, restore, take_record

log = logging.getLogger(__name__)

LOCK = NODE_LOCK
MANAGED_PREFIXES = [str(KUBELET_ROOT), str(CONTAINERD_ROOT), str(CONTAINERD_STATE.parent), "/run/netns"]


class LocalClusterBusy(RuntimeError):
    """Another LocalCluster holds this machine's node lock."""


class TeardownIncomplete(RuntimeError):
    """The machine could not be restored; the message lists what is left."""


@dataclass
class _RecordingGroup(ProcessGroup):
    """A ProcessGroup that reports each started process (to the host record)."""

    on_start: Callable | None = None

    def start(self, name, argv, env=None):
        proc = super().start(name, argv, env)
        if self.on_start:
            self.on_start(name, proc)
        return proc


class LocalCluster(ControlPlane):
    def __init__(self, state_dir: Path | None = None, node_name: str | None = None,
                 node_ready_timeout: float = 120.0, lock_timeout: float = 900.0,
                 extra_kubelet_flags: list[str] = (), drain_timeout: float = 60.0):
        super().__init__(state_dir=state_dir, node_name=node_name or default_node_name())
        logs = self.state_dir / "logs"
        self.processes = _RecordingGroup(logs, on_start=self._record_process)
        self.runtime_processes = _RecordingGroup(logs, on_start=self._record_process)
        self.kubelet_processes = _RecordingGroup(logs, on_start=self._record_process)
        self.node_ready_timeout, self.lock_timeout = node_ready_timeout, lock_timeout
        self.drain_timeout = drain_timeout
        self.extra_kubelet_flags = list(extra_kubelet_flags)
        self.containerd: Containerd | None = None
        self.record: HostRecord | None = None
        self.leftovers: list[str] = []
        self.timings: dict[str, float] = {}
        self.started: list[tuple[str, int]] = []   # every process ever started, (name, pid)
        self._lock_file = None
        self._stopped = True
        atexit.register(self.stop)

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> "LocalCluster":
        began = time.monotonic()
        self._stopped = False
        self._take_lock()
        self.timings["lock_wait_seconds"] = round(time.monotonic() - began, 2)
        began = time.monotonic()
        self._install_sigterm()
        apt_install(PACKAGES)
        ensure_binaries(CONTROL_PLANE + NODE)
        self._recover_earlier_run()
        self.record = take_record(MANAGED_PREFIXES)
        self.record.runtime_address = str(CONTAINERD_STATE / "containerd.sock")
        self.record.scratch_dirs = [str(self.state_dir)]
        self.record.save(RECORD)
        sandbox_image, sandbox_tar = pause_image()
        super().start(timeout)
        self.timings["control_plane_seconds"] = round(time.monotonic() - began, 2)
        self.containerd = Containerd(self.runtime_processes, sandbox_image)
        self.containerd.start()
        self.containerd.remove_workloads()   # containers an earlier, crashed run left behind
        # the image store follows the image cache: what the cache pruned goes here too
        self.containerd.prune_images("resident.local/", keep=cached_image_names())
        self.containerd.import_image(sandbox_tar)
        self._start_kubelet(sandbox_image)
        kubelet_began = time.monotonic()
        self._wait_node_ready(self.node_ready_timeout)
        self.timings["kubelet_to_ready_seconds"] = round(time.monotonic() - kubelet_began, 2)
        self.wait_for_service_account("default")
        self.timings["start_seconds"] = round(time.monotonic() - began, 2)
        log.info("local cluster ready", extra={"node": self.node_name, "server": self.server, **self.timings})
        return self

    def stop(self) -> None:
        """Tear everything down; idempotent. Raises TeardownIncomplete if the host is not restored."""
        if self._stopped:
            return
        self._stopped = True
        began = last = time.monotonic()

        def lap(step: str) -> None:
            nonlocal last
            now = time.monotonic()
            self.timings[f"teardown_{step}_seconds"] = round(now - last, 2)
            last = now

        errors: list[str] = []

        def attempt(step: str, action) -> None:
            # every step runs even if an earlier one failed; the host record is restored last
            try:
                action()
            except Exception as e:
                log.error("teardown step %s failed: %s", step, e)
                errors.append(f"{step}: {e}")

        try:
            if self.port and self.kubelet_processes.children:
                attempt("delete pods", lambda: drain_pods(self.api_client(), self.drain_timeout))
            lap("drain")
            attempt("stop kubelet", self.kubelet_processes.stop)
            if self.containerd is not None:
                attempt("remove containers", self.containerd.remove_workloads)
                attempt("stop containerd", self.runtime_processes.stop)
                attempt("stop shims", self.containerd.stop_shims)
            lap("node")
            attempt("stop control plane", super().stop)
            lap("control_plane")
            if self.record is not None:
                record, self.record = self.record, None
                attempt("restore host", lambda: self.leftovers.extend(restore(record)))
            lap("restore")
        finally:
            self._release_lock()
            self.timings["teardown_seconds"] = round(time.monotonic() - began, 2)
        if self.leftovers:
            raise TeardownIncomplete(f"the machine was not fully restored: {self.leftovers}")
        if errors and not self.leftovers:
            log.warning("teardown had errors but the machine is restored: %s", errors)

    # -- what tests and the demo call ---------------------------------------------------
    def import_image(self, tarball: Path | str) -> list[str]:
        """Import an OCI image-layout tarball into the node's containerd; returns its names."""
        if self.containerd is None or not self.containerd.running:
            raise RuntimeError("the local cluster is not running; start it before importing images")
        return self.containerd.import_image(Path(tarball))

    def operator_env(self, owner_image: str | None = None) -> dict[str, str]:
        """Environment for an operator run against this cluster: the single-node setting.

        Owners run with hostNetwork (the only network is loopback) and are reached at
        127.0.0.1, never at the node's InternalIP (``RESIDENT_*`` as the operator reads them).
        """
        env = {"KUBECONFIG": self.kubeconfig, "RESIDENT_OWNER_HOST": "127.0.0.1",
               "RESIDENT_OWNER_HOST_NETWORK": "true"}
        if owner_image:
            env["RESIDENT_OWNER_IMAGE"] = owner_image
        return env

    def wait_for_service_account(self, namespace: str, name: str = "default", timeout: float = 60.0) -> None:
        """Wait until the ServiceAccount exists with its token Secret (Pods need both in 1.20)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        while True:
            try:
                account = core.read_namespaced_service_account(name, namespace)
                if account.secrets:
                    return
            except ApiException as e:
                if e.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"ServiceAccount {namespace}/{name} has no token after {timeout}s")
            time.sleep(0.3)

    # -- pieces ----------------------------------------------------------------------
    def _record_process(self, name: str, proc) -> None:
        self.started.append((name, proc.pid))
        if self.record is not None:
            self.record.add_process(name, proc)

    def _take_lock(self) -> None:
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(LOCK, "a+")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._lock_file.seek(0)
                    holder = self._lock_file.read().strip() or "unknown"
                    self._lock_file.close()
                    self._lock_file = None
                    raise LocalClusterBusy(
                        f"another LocalCluster runs on this machine (pid {holder}, lock {LOCK}); "
                        f"waited {self.lock_timeout:.0f}s") from None
                time.sleep(0.5)
        self._lock_file.truncate(0)
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.truncate(0)
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):
            try:
                self.stop()
            finally:
                if callable(previous):
                    previous(signum, frame)
                os._exit(143)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _recover_earlier_run(self) -> None:
        earlier = HostRecord.load(RECORD)
        if earlier is None:
            return
        log.warning("an earlier local cluster (pid %d) did not finish its teardown; restoring the machine",
                    earlier.taken_by_pid)
        remaining = restore(earlier)
        if remaining:
            raise TeardownIncomplete(f"cannot restore what an earlier run left: {remaining}")

    def _start_kubelet(self, sandbox_image: str) -> None:
        config = self.state_dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(free_port(), free_port(), self.kubelet_client_ca)))
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        self.kubelet_processes.start("kubelet", kubelet_argv(
            self.bin_dir / "kubelet", config, self.node_kubeconfig, self.node_name, self.containerd.socket,
            sandbox_image, extra=self.extra_kubelet_flags))

    def _wait_node_ready(self, timeout: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        status = "not registered"
        while time.monotonic() < deadline:
            for group in (self.processes, self.runtime_processes, self.kubelet_processes):
                group.check_alive()
            try:
                node = core.read_node(self.node_name)
                conditions = {c.type: c for c in (node.status.conditions or [])}
                ready = conditions.get("Ready")
                if ready is not None and ready.status == "True":
                    return
                status = f"Ready={ready.status}: {ready.message}" if ready else "no Ready condition"
            except ApiException as e:
                if e.status != 404:
                    raise
            time.sleep(0.5)
        raise TimeoutError(f"node {self.node_name} not Ready after {timeout}s ({status}); kubelet log:\n"
                           + self.kubelet_processes.log_tail("kubelet"))


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m localcluster.node", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-image", action="store_true",
                        help="build (or reuse) the project image and import it into the node")
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster until Ctrl-C or SIGTERM (prints its KUBECONFIG), then tear it down")
    args = parser.parse_args(argv)
    from bundle.jsonlog import configure

    configure(logging.INFO)
    with LocalCluster() as cluster:
        if args.project_image:
            name, tarball = project_image()
            print(f"imported {cluster.import_image(tarball)}")
        print(cluster.kubectl("get", "nodes", "-o", "wide").stdout)
        print(f"KUBECONFIG={cluster.kubeconfig}  timings={cluster.timings}", flush=True)
        if args.keep:
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    print(f"torn down in {cluster.timings['teardown_seconds']}s; the machine is restored", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
