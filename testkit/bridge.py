"""Test harness for the bridge: real bundles on disk, a real bridge, a real CSI client.

Used by the component and cluster tests and the benchmarks (and usable by hand); part of
the test seam (:mod:`testkit`), so not in the image:
- :func:`make_bundle` writes a small bundle directory with a manifest (file:// source);
- :class:`BridgeProcess` runs ``python -m csi_bridge`` as a child process, so tests can
  kill it and start it again, and always stops it; ``start(crash_at=POINT)`` runs it
  through :mod:`testkit.crash_points` instead, which ends it at that step;
- :class:`CsiClient` speaks gRPC to the bridge's unix socket;
- :func:`cleanup_mounts` unmounts everything under a test directory, deepest first.
Nothing here is a fake: every call crosses a real socket and every mount is real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from bundle.scan import build_manifest, write_manifest
from testkit import crash_points
from csi_bridge import mountinfo, mounts
from csi_bridge.proto import csi_pb2, csi_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
Mode = csi_pb2.VolumeCapability.AccessMode.Mode


def make_bundle(root: Path, files: dict[str, bytes], chunk_size: int = 64 * 1024) -> str:
    """Write ``files`` under ``root`` plus its manifest; return the bundle digest."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    manifest = build_manifest(root, chunk_size=chunk_size)
    write_manifest(root, manifest)
    return manifest.digest


def mount_capability(mode=Mode.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                    access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode))


def publish_request(volume_id: str, target: Path | str, digest: str, source: str, *,
                    namespace: str = "team-a", pod: str = "owner-0", pod_uid: str = "uid-0",
                    model: str = "m", readonly: bool = True,
                    secrets: dict[str, str] | None = None) -> csi_pb2.NodePublishVolumeRequest:
    """What kubelet sends for an inline volume; ``secrets``: the data of the Secret its
    ``nodePublishSecretRef`` names."""
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id, target_path=str(target), volume_capability=mount_capability(),
        readonly=readonly, secrets=secrets or {},
        volume_context={"digest": digest, "source": source, "model": model,
                        "csi.storage.k8s.io/pod.name": pod,
                        "csi.storage.k8s.io/pod.namespace": namespace,
                        "csi.storage.k8s.io/pod.uid": pod_uid,
                        "csi.storage.k8s.io/ephemeral": "true"})


class CsiClient:
    def __init__(self, socket: Path | str):
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)

    def wait_ready(self, timeout: float = 20.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BridgeProcess:
    """``python -m csi_bridge`` in a child process with its own root and socket."""

    def __init__(self, root: Path, *, node_id: str = "node-a", authorize: str = "allow-any",
                 extra_args: tuple[str, ...] = (), env: dict | None = None,
                 pods_dir: Path | None = None, store: Path | None = None):
        self.root, self.socket = Path(root), Path(root) / "csi.sock"
        # the tests' "kubelet pods directory": by default <root's parent>/kubelet; the node
        # store and the bridge's state: by default <root>/data
        self.args = [sys.executable, "-m", "csi_bridge", "--endpoint", f"unix://{self.socket}",
                     "--node-id", node_id, "--root", str(store or self.root / "data"),
                     "--pods-dir", str(pods_dir or self.root.parent / "kubelet"),
                     "--authorize", authorize, "--metrics-port", "-1", *extra_args]
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "bridge.log"

    def start(self, env: dict | None = None, timeout: float = 30.0,
              crash_at: str | None = None) -> "BridgeProcess":
        """Start the bridge and wait until all of it serves; with ``crash_at``, armed to exit at
        that crash point (:mod:`testkit.crash_points`), which a test sees in :meth:`wait_exit`."""
        self.root.mkdir(parents=True, exist_ok=True)
        logged = self.log.stat().st_size if self.log.exists() else 0
        args, env = self.args, {**self.env, **(env or {})}
        if crash_at is not None:
            args = [args[0], "-m", "testkit.crash_points", *args[3:]]
            env[crash_points.CRASH_ENV] = crash_at
        self.proc = subprocess.Popen(args, env=env,
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
                                     cwd=str(REPO_ROOT))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bridge exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            # kubelet's sockets serve first; the process is whole once it logs "bridge connected"
            if self.socket.exists():
                with open(self.log, "rb") as log:
                    log.seek(logged)
                    if b'"bridge connected"' in log.read():
                        return self
            time.sleep(0.05)
        raise RuntimeError(f"bridge did not serve {self.socket} in {timeout}s")

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def cleanup_mounts(under: Path) -> int:
    """Unmount every mount at or below ``under`` (deepest first); return how many."""
    n = 0
    for m in mountinfo.mounts_under(Path(under).resolve()):
        try:
            mounts.unmount(Path(m.mount_point), lazy_if_busy=True)
            n += 1
        except OSError:
            pass
    return n
