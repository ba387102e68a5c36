"""A gRPC interceptor that logs every call (as JSON lines: :mod:`bundle.jsonlog`).

Each CSI call is logged once with ``method``, ``volume`` (the volume id when the request
has one), ``duration_seconds`` and ``code``. Requests are never logged whole: CSI
requests may carry ``secrets``, so only the named fields are picked out.
"""

from __future__ import annotations

import logging
import time

import grpc

log = logging.getLogger("resident.bridge")


class CallLogger(grpc.ServerInterceptor):
    """Logs and counts every unary call: method, volume id, duration and gRPC code."""

    def __init__(self, metrics=None):
        self.metrics = metrics

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary

        def behavior(request, context):
            start = time.monotonic()
            code = grpc.StatusCode.OK
            try:
                return inner(request, context)
            except Exception:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                if context.code() is not None:
                    code = context.code()
                name = getattr(code, "name", str(code))
                if self.metrics is not None:
                    self.metrics.requests.labels(method, name).inc()
                level = logging.DEBUG if method in ("Probe", "GetPluginInfo") and name == "OK" \
                    else logging.INFO
                log.log(level, "csi call", extra={
                    "method": method, "volume": getattr(request, "volume_id", "") or None,
                    "duration_seconds": round(time.monotonic() - start, 6), "code": name})

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
