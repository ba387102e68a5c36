"""Structured logs: one JSON object per line, through the standard logging module.

Every record carries time, level, logger and message, plus the ``extra`` fields the
operator attaches (``model``, ``reason``, ``settings``...). kopf's own records go through
the same formatter, so one log stream can be filtered by model.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
               "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class QuietTimers(logging.Filter):
    """Drop kopf's "Timer 'resync' succeeded." lines: the timers tick every second."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Timer ") and msg.endswith(" succeeded."))


def setup(level: int = logging.INFO, json_lines: bool = True) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if json_lines else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(QuietTimers())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # Python warnings become log records too
