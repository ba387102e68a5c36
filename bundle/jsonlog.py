"""Structured logs for every component: one JSON object per line, the same field names.

Each line has ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``msg``,
then every ``extra=`` field of the record, none dropped, and ``exc`` with the traceback
when there is one. Code logs with ``log.info("materialized", extra={"digest": d,
"bytes_fetched": n})``. A value that is not JSON (a path, an enum) is written as its
``str()``. The bundle tools, the bridge, the owner and the operator all call
:func:`configure` when they start: ``bundle`` is the one package every component imports,
so this is the only formatter in the repository. A component that must leave something
out (the operator drops kopf's routine success lines) passes a :class:`logging.Filter`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Iterable, TextIO

BASE_FIELDS = ("ts", "level", "logger", "msg")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JSONLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: int | str = logging.INFO, *, filters: Iterable[logging.Filter] = (),
              stream: TextIO | None = None) -> logging.Handler:
    """Send every record (the root logger's) to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONLineFormatter())
    for f in filters:
        handler.addFilter(f)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # Python warnings become log records too
    return handler
