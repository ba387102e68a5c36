"""The operator's logs: the shared JSON lines (:mod:`bundle.jsonlog`), minus kopf's noise.

Every record carries ``ts``, ``level``, ``logger`` and ``msg``, plus the ``extra`` fields
the operator attaches (``model``, ``reason``...). kopf's own records go through the same
formatter, so one log stream can be filtered by model. Two things are left out, both
kopf's and neither data: the whole settings object kopf attaches to every object's record
(2 KB a line), and its "Handler ... succeeded." line for each watch event (the operator
handles an event per child change, and those lines would be most of the log).
"""

from __future__ import annotations

import logging

from bundle import jsonlog


class QuietSuccesses(logging.Filter):
    """Drop kopf's routine success lines of event handlers, indexes and timers."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(("Handler ", "Timer ", "Indexing handler ")) and msg.endswith(" succeeded.")
                    and record.levelno <= logging.INFO)


class WithoutKopfSettings(logging.Filter):
    """kopf attaches its OperatorSettings to each object's record as ``settings``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("settings", None)
        return True


FILTERS = (QuietSuccesses(), WithoutKopfSettings())


def setup(level: int = logging.INFO, json_lines: bool = True, stream=None) -> None:
    """The operator's logs: :func:`bundle.jsonlog.configure` with kopf's noise left out."""
    jsonlog.configure(level, json_lines=json_lines, filters=FILTERS, stream=stream)
