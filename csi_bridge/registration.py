"""kubelet plugin registration, served by the bridge itself (no node-driver-registrar).

kubelet watches ``/var/lib/kubelet/plugins_registry/`` for ``<driver>-reg.sock``. On a
new socket it calls ``GetInfo`` and learns the plugin's type (``CSIPlugin``), name, CSI
endpoint and supported versions, then reports the result with
``NotifyRegistrationStatus``. The bridge logs that result and remembers it
(``registered``), so a test or a health check can see whether kubelet accepted it.
"""

from __future__ import annotations

import logging
import threading

from .proto import pluginregistration_pb2 as pb, pluginregistration_pb2_grpc as pb_grpc

log = logging.getLogger("resident.bridge.registration")
SUPPORTED_VERSIONS = ("1.0.0",)


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, driver: str, csi_endpoint: str):
        self.driver, self.csi_endpoint = driver, csi_endpoint.removeprefix("unix://")
        self.registered: bool | None = None
        self.error = ""
        self.notified = threading.Event()

    def GetInfo(self, request, context):
        return pb.PluginInfo(type="CSIPlugin", name=self.driver, endpoint=self.csi_endpoint,
                             supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request, context):
        self.registered, self.error = request.plugin_registered, request.error
        self.notified.set()
        if request.plugin_registered:
            log.info("kubelet registered the plugin", extra={"method": "NotifyRegistrationStatus"})
        else:
            log.error("kubelet refused the plugin",
                      extra={"method": "NotifyRegistrationStatus", "error": request.error})
        return pb.RegistrationStatusResponse()


def socket_name(driver: str) -> str:
    return f"{driver}-reg.sock"
