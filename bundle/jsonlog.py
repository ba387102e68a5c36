"""Structured logs for every component: one JSON object per line, the same field names.

Each line has ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``msg``,
then every ``extra=`` field of the record, none dropped, and ``exc`` with the traceback
when there is one. Code logs with ``log.info("materialized", extra={"digest": d,
"bytes_fetched": n})``. A value that is not JSON (a path, an enum) is written as its
``str()``.

:func:`configure` is the one place logging is set up, for every entry point: ``resident
bundle``, ``bridge``, ``owner`` and ``operator``, the bundle server (``python -m
bundle.sources.httpserve``) and the local-cluster tools each call it once when they start,
with their level, and nothing else touches the root logger (a unit test checks it).
``bundle`` is the one package every component imports, so this is the only formatter in
the repository. A component that must leave something out (the operator drops kopf's
routine success lines) passes a :class:`logging.Filter`; ``json_lines=False`` gives plain
text for people at a terminal (``resident operator --log-format plain``, the demo).

Logger names say which component wrote a line: ``resident.bundle.*``, ``resident.bridge.*``,
``resident.owner.*`` and ``resident.operator.*`` (kopf's own records keep ``kopf.*``).
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


PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: int | str = logging.INFO, *, json_lines: bool = True,
              filters: Iterable[logging.Filter] = (), stream: TextIO | None = None) -> logging.Handler:
    """Send every record (the root logger's) at ``level`` and above to ``stream`` (stderr),
    as JSON lines or, with ``json_lines=False``, as plain text; Python warnings too."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONLineFormatter() if json_lines else logging.Formatter(PLAIN_FORMAT))
    for f in filters:
        handler.addFilter(f)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # Python warnings become log records too
    return handler
