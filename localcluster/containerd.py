"""containerd for a local node: containerd 2 built from its Go module, Debian's runc, its CRI plugin, the Pod network.

kubelet 1.36 and newer ask the runtime for its cgroup driver (the CRI ``RuntimeConfig``
call, added in containerd 2.0) and refuse to start without it; Debian 12 ships containerd
1.6. So containerd, its runc shim and ``ctr`` are built from
``github.com/containerd/containerd/v2`` (:func:`containerd_build`, once per machine, cached
by version like Kubernetes); runc stays Debian's.

The daemon gets paths of its own, so it never meets a containerd the machine may run:
its socket and state under ``/run/resident/containerd``, its content and snapshots under
``/var/lib/resident/containerd``. The root is kept between runs on purpose: it is the
image store, so an image imported once (``ctr -n k8s.io images import``) is there next
time and a re-import only checks digests. Nothing else in it survives a teardown: every
task is killed and every container removed before the daemon stops.

The CRI settings that matter here:

- ``restrict_oom_score_adj = true``: root on these machines lacks CAP_SYS_RESOURCE;
  without it every sandbox fails in runc with "can't get final child's PID from pipe".
- the sandbox image is our own pause image (:func:`localcluster.images.pause_image`);
- CNI: the Pod network (:func:`pod_network_config`), the reference ``bridge`` and
  ``host-local`` plugins from Debian's ``containernetworking-plugins``: each Pod gets an
  address in its node's Pod range on the bridge ``cni0``, whose gateway is the node. The
  config is written once the controller-manager has given the node its range (containerd
  reads its CNI directory as it changes); until then the node is not Ready.
- the daemon runs in its node's network namespace (:mod:`localcluster.network`), so the
  ``cni0`` bridge and host-network Pods are the node's, not the machine's;
- the CRI streaming server (exec, attach, port-forward) binds the node's 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from .gobuild import GoBuild, ensure_built
from .oci_layout import image_names
from .processes import ProcessGroup

log = logging.getLogger(__name__)

ROOT = Path("/var/lib/resident/containerd")
STATE = Path("/run/resident/containerd")
NAMESPACE = "k8s.io"
CNI_BIN_DIR = "/usr/lib/cni"
PACKAGES = ("runc", "containernetworking-plugins", "busybox-static", "iptables")
CONTAINERD_VERSION = "2.4.2"


def containerd_build() -> GoBuild:
    module = "github.com/containerd/containerd/v2"
    return GoBuild(name=f"containerd-{CONTAINERD_VERSION}", requires={module: f"v{CONTAINERD_VERSION}"},
                   commands={c: f"{module}/cmd/{c}" for c in ("containerd", "containerd-shim-runc-v2", "ctr")},
                   ldflags=f"-s -w -X {module}/version.Version=v{CONTAINERD_VERSION}", log="containerd-build.log",
                   what=f"building containerd {CONTAINERD_VERSION} from its Go module (first run, about 5 min)")
POD_NETWORK = "resident-pods"


def pod_network_config(pod_range: str, ipam_dir: Path) -> dict:
    """The CNI network list for a node whose Pods take addresses from ``pod_range``, with
    the address leases kept in ``ipam_dir`` (one per node: the default is machine-wide); pure."""
    return {"cniVersion": "1.0.0", "name": POD_NETWORK, "plugins": [{
        "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
        # a Pod may reach itself through its own Service
        "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_range}]], "routes": [{"dst": "0.0.0.0/0"}],
                 "dataDir": str(ipam_dir)},
    }]}


class ImageImportError(RuntimeError):
    """``ctr images import`` refused a tarball; nothing was imported under its names."""


def containerd_config(root: Path, state: Path, socket: Path, sandbox_image: str, cni_conf_dir: Path) -> str:
    """The containerd config (v2) for the local node; pure."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{state}"
oom_score = 0

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1
"""


class Containerd:
    """One containerd daemon, started through a :class:`ProcessGroup` and stopped by PID."""

    def __init__(self, processes: ProcessGroup, sandbox_image: str, root: Path = ROOT, state: Path = STATE,
                 enter: list[str] = ()):
        self.processes, self.sandbox_image = processes, sandbox_image
        self.enter = list(enter)   # the argv prefix that puts the daemon in its node's network
        self.bin_dir = ensure_built(containerd_build())
        self.root, self.state = root, state
        self.socket = state / "containerd.sock"
        self.conf_dir = state.with_name(f"{state.name}-conf")   # the daemon's config, CNI config and leases
        self.cni_conf_dir = self.conf_dir / "net.d"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> None:
        for d in (self.root, self.state, self.cni_conf_dir):
            d.mkdir(parents=True, exist_ok=True)
        for stale in self.cni_conf_dir.glob("*.conflist"):
            stale.unlink()
        config = self.conf_dir / "containerd.toml"
        config.write_text(containerd_config(self.root, self.state, self.socket, self.sandbox_image, self.cni_conf_dir))
        # the daemon finds its runc shim on PATH
        env = dict(os.environ, PATH=f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self.proc = self.processes.start("containerd", [*self.enter, str(self.bin_dir / "containerd"),
                                                        "--config", str(config)], env=env)
        self._await_answer(timeout)

    def restart(self, down_seconds: float = 0.0, timeout: float = 30.0) -> None:
        """Kill the daemon (SIGKILL, as a crash would), wait ``down_seconds`` and start it
        again with the same configuration. Its shims, and so the containers, run on."""
        self.proc = self.processes.restart("containerd", down_seconds, signal.SIGKILL)
        self._await_answer(timeout)

    def _await_answer(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.ctr("version", check=False).returncode != 0:
            self.processes.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"containerd did not answer on {self.socket} in {timeout}s:\n"
                                   + self.processes.log_tail("containerd"))
            time.sleep(0.2)
        log.info("containerd ready", extra={"socket": str(self.socket), "pid": self.proc.pid})

    def write_pod_network(self, pod_range: str) -> None:
        """Give the node's Pods addresses from ``pod_range`` (written whole, then renamed)."""
        tmp = self.cni_conf_dir / ".pods.tmp"
        tmp.write_text(json.dumps(pod_network_config(pod_range, self.conf_dir / "ipam")))
        tmp.rename(self.cni_conf_dir / "10-pods.conflist")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.bin_dir / "ctr"), "--address", str(self.socket), "-n", NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def image_list(self) -> set[str]:
        return set(self.ctr("images", "list", "-q").stdout.split())

    def import_image(self, tarball: Path) -> list[str]:
        """Import an OCI image-layout tarball; return the names it carries, now present."""
        names = image_names(Path(tarball))   # clear errors for a missing or foreign file
        proc = self.ctr("images", "import", str(tarball), check=False)
        if proc.returncode != 0:
            raise ImageImportError(f"ctr images import {tarball} failed: {proc.stderr.strip()}")
        missing = set(names) - self.image_list()
        if missing:
            raise ImageImportError(f"after importing {tarball}, containerd lacks {sorted(missing)}")
        return names

    def _config_digests(self, target: str) -> set[str]:
        doc = json.loads(self.ctr("content", "get", target).stdout)
        if "manifests" in doc:
            return set().union(*(self._config_digests(m["digest"]) for m in doc["manifests"]))
        return {doc["config"]["digest"]}

    def prune_images(self, prefix: str, keep: set[str]) -> list[str]:
        """Remove images named ``prefix*`` that are not in ``keep``, and the references that
        only held them: the CRI's ``sha256:<image id>`` refs. Call it with no containers running."""
        targets = {}
        for row in self.ctr("images", "list").stdout.splitlines()[1:]:
            fields = row.split()
            if len(fields) >= 3:
                targets[fields[0]] = fields[2]
        stale = [n for n in targets if n.startswith(prefix) and n not in keep]
        named = [n for n in targets if not n.startswith("sha256:") and n not in stale]
        live_ids = set().union(*(self._config_digests(targets[n]) for n in named)) if named else set()
        stale += [n for n in targets if n.startswith("sha256:") and n not in live_ids]
        if stale:
            self.ctr("images", "remove", "--sync", *sorted(stale))
            log.info("removed stale images", extra={"images": sorted(stale)})
        return sorted(stale)

    def remove_workloads(self) -> None:
        """Kill every task and remove every container in the CRI namespace."""
        if not self.running:
            return
        tasks = self.ctr("tasks", "list", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False, timeout=30)
        for task in tasks:
            deadline = time.monotonic() + 10
            while self.ctr("tasks", "delete", "--force", task, check=False, timeout=30).returncode != 0:
                if task not in self.ctr("tasks", "list", "-q", check=False).stdout.split():
                    break
                if time.monotonic() > deadline:
                    log.warning("task %s would not go away", task)
                    break
                time.sleep(0.3)
        for container in self.ctr("containers", "list", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False, timeout=30)

    def shim_pids(self) -> list[int]:
        """PIDs of containerd-shim processes that belong to this daemon (by its socket path)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(self.socket).encode() in argv:
                pids.append(int(entry.name))
        return pids

    def stop_shims(self, timeout: float = 5.0) -> None:
        """Shims outlive containerd by design; after the tasks are gone, end any left by PID."""
        pids = self.shim_pids()
        for pid in pids:
            _kill(pid, 15)
        deadline = time.monotonic() + timeout
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists()]
            time.sleep(0.1)
        for pid in pids:
            log.warning("containerd shim %d ignored SIGTERM; killing", pid)
            _kill(pid, 9)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
