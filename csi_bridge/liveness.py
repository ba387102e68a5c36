"""Liveness: kubelet asks over HTTP whether the bridge still answers CSI.

kubelet's liveness probes speak HTTP, TCP, exec or gRPC on a port, not CSI on a unix
socket. So ``/healthz`` turns the question into the one a CO asks a plugin: it makes a
real ``Probe`` call to the bridge's own CSI socket, with a short deadline, and answers
200 when the plugin says it is ready, 500 with the reason when it says it is not, fails
the call, or misses the deadline. The call crosses the same socket, gRPC server and
worker threads as kubelet's own NodePublishVolume, so a wedged server or a pool of stuck
workers fails it, and ``Probe`` itself reports a store or database the bridge cannot use
(:meth:`csi_bridge.server.Bridge.health`). A frozen process answers nothing at all, and
kubelet's own probe timeout fails it.

This is what the CSI project's ``livenessprobe`` sidecar does from a container of its
own; the chart uses that sidecar in its sidecar registration mode and this endpoint in
the builtin one (docs/csi-bridge.md, "Liveness").
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from .proto import csi_pb2, csi_pb2_grpc

PROBE_TIMEOUT_SECONDS = 1.0  # as the livenessprobe sidecar's default --probe-timeout


class LivenessCheck:
    """A CSI Probe of one plugin socket, and the ``/healthz`` WSGI app that reports it."""

    def __init__(self, socket: Path | str, timeout: float = PROBE_TIMEOUT_SECONDS):
        self.target, self.timeout = f"unix://{socket}", timeout
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()

    def _stub(self) -> csi_pb2_grpc.IdentityStub:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(self.target)
            return csi_pb2_grpc.IdentityStub(self._channel)

    def problem(self) -> str | None:
        """None when the plugin's Probe says ready in time; otherwise why not."""
        try:
            response, call = self._stub().Probe.with_call(csi_pb2.ProbeRequest(),
                                                          timeout=self.timeout)
        except grpc.RpcError as e:
            return f"CSI Probe on {self.target} failed: {e.code().name}: {e.details()}"
        # CSI: a Probe response without `ready` means ready.
        if not response.HasField("ready") or response.ready.value:
            return None
        reason = dict(call.trailing_metadata() or ()).get("not-ready-reason", "no reason given")
        return f"CSI Probe on {self.target}: not ready: {reason}"

    def app(self, environ, start_response):
        problem = self.problem()
        status, body = ("200 OK", "ok\n") if problem is None else \
            ("500 Internal Server Error", problem + "\n")
        data = body.encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                                ("Content-Length", str(len(data)))])
        return [data]

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
