"""CSI Identity service: who the plugin is, what it offers, and whether it is ready.

The bridge is node-only: it advertises no plugin capability (no CONTROLLER_SERVICE, no
topology), which tells the CO not to look for a controller. ``Probe`` answers at once
from a cheap health check of the store and the bridge database, and reports not-ready
(instead of failing the call) so a liveness probe can tell "alive but unusable" apart.
"""

from __future__ import annotations

import re
from typing import Callable

from google.protobuf import wrappers_pb2

from .proto import csi_pb2, csi_pb2_grpc

DRIVER_NAME = "bundles.resident.dev"
NAME_RE = re.compile(r"^[a-zA-Z][A-Za-z0-9-._]{0,61}[a-zA-Z]$")


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    def __init__(self, version: str, health: Callable[[], str | None], name: str = DRIVER_NAME):
        if not NAME_RE.match(name):
            raise ValueError(f"driver name {name!r} is not a valid CSI plugin name")
        self.name, self.version, self.health = name, version, health

    def GetPluginInfo(self, request, context):
        return csi_pb2.GetPluginInfoResponse(name=self.name, vendor_version=self.version,
                                             manifest={"project": "resident"})

    def GetPluginCapabilities(self, request, context):
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=[])

    def Probe(self, request, context):
        problem = self.health()
        if problem:
            context.set_trailing_metadata((("not-ready-reason", problem[:200]),))
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=problem is None))
