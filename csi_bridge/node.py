"""CSI Node service, the volume calls: thin handlers over the argument checks and the publisher.

Each handler validates its request (``arguments``; publish and unpublish targets must lie
under kubelet's pods directory when one is configured), calls the publisher, and turns a
:class:`CsiError` into ``context.abort(code, message)``. kubelet reaches them through
:class:`.sockets.HeldNode`, which answers NodeGetInfo and NodeGetCapabilities itself.
"""

from __future__ import annotations

import logging
import time

import grpc

from . import arguments
from .proto import csi_pb2
from .publisher import Publisher
from .status import CsiError

log = logging.getLogger("resident.bridge.node")


class NodeServicer:
    def __init__(self, publisher: Publisher, publish_wait_seconds: float = 100.0, pods_dir=None):
        self.publisher = publisher
        self.pods_dir = None if pods_dir is None else str(pods_dir)  # targets must lie under it
        self.publish_wait_seconds = publish_wait_seconds
        self.metrics = publisher.metrics

    def NodePublishVolume(self, request, context):
        start, result = time.monotonic(), "error"
        try:
            args = arguments.check_publish(request)
            arguments.check_confined(args.target_path, self.pods_dir)
            remaining = context.time_remaining()
            wait = self.publish_wait_seconds
            if remaining is not None:
                wait = min(wait, max(0.0, remaining - 5.0))
            result = self.publisher.publish(args, wait)
            # kubelet publishes every mounted volume again about once a minute
            # (requiresRepublish): a confirmation is not news
            log.log(logging.DEBUG if result == "confirmed" else logging.INFO, "published", extra={"volume": args.volume_id, "target": args.target_path,
                                         "digest": args.bundle.digest, "phase": result,
                                         "namespace": args.pod.namespace or None})
            return csi_pb2.NodePublishVolumeResponse()
        except CsiError as e:
            result = e.code.name.lower()
            log.log(logging.INFO if e.code == grpc.StatusCode.ABORTED else logging.WARNING,
                    "publish not done", extra={"volume": request.volume_id,
                                               "target": request.target_path,
                                               "code": e.code.name, "error": e.message})
            context.abort(e.code, e.message)
        finally:
            self.metrics.publish_seconds.labels(result).observe(time.monotonic() - start)

    def NodeUnpublishVolume(self, request, context):
        start, result = time.monotonic(), "error"
        try:
            args = arguments.check_unpublish(request)
            arguments.check_confined(args.target_path, self.pods_dir)
            result = self.publisher.unpublish(args)
            return csi_pb2.NodeUnpublishVolumeResponse()
        except CsiError as e:
            result = e.code.name.lower()
            context.abort(e.code, e.message)
        finally:
            self.metrics.unpublish_seconds.labels(result).observe(time.monotonic() - start)

    def NodeGetVolumeStats(self, request, context):
        try:
            args = arguments.check_stats(request)
            st, used, problem = self.publisher.usage(args.volume_id, args.volume_path)
        except CsiError as e:
            context.abort(e.code, e.message)
        total = st.f_blocks * st.f_frsize
        return csi_pb2.NodeGetVolumeStatsResponse(
            usage=[csi_pb2.VolumeUsage(unit=csi_pb2.VolumeUsage.BYTES, total=total, used=used,
                                       available=0),
                   csi_pb2.VolumeUsage(unit=csi_pb2.VolumeUsage.INODES, total=st.f_files,
                                       used=st.f_files - st.f_ffree, available=0)],
            volume_condition=csi_pb2.VolumeCondition(abnormal=bool(problem),
                                                     message=problem or "read-only bundle mounted"))
