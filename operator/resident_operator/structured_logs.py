"""Structured logs: one JSON object per line, through the standard logging module.

Every record carries time, level, logger and message, plus the ``extra`` fields the
operator attaches (``model``, ``reason``, ``settings``...). kopf's own records go through
the same formatter, so one log stream can be filtered by model; extras that are not plain
data (kopf attaches its whole settings object to every object's record) are left out.
kopf's "Handler ... succeeded." line for each watch event is dropped: the operator
handles an event per child change, and those lines would be most of the log.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_PLAIN = (str, int, float, bool, type(None), dict, list, tuple)


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
               "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and isinstance(value, _PLAIN):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class QuietSuccesses(logging.Filter):
    """Drop kopf's routine success lines of event handlers, indexes and timers."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(("Handler ", "Timer ", "Indexing handler ")) and msg.endswith(" succeeded.")
                    and record.levelno <= logging.INFO)


def setup(level: int = logging.INFO, json_lines: bool = True) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if json_lines else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(QuietSuccesses())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # Python warnings become log records too
