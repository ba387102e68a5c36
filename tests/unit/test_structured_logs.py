"""Every component logs JSON lines with the same field names and keeps every extra field."""

from __future__ import annotations

import ast
import io
import json
import logging
from pathlib import Path

import pytest

from bundle import jsonlog

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("bundle", "csi_bridge", "owner", "operator/resident_operator")
# Where each component sets up its logs at start; each must use bundle.jsonlog.
STARTS = {"bundle": "bundle/cli.py", "csi_bridge": "csi_bridge/__main__.py",
          "owner": "owner/__main__.py", "operator": "operator/resident_operator/structured_logs.py"}
# Records as the components write them (logger, message, extra), with the fields the old
# bridge formatter dropped: fallback reasons, byte counts by kind, seconds.
RECORDS = {
    "bundle": ("resident.bundle.store", "materialized", {
        "digest": "sha256:" + "a" * 64, "method": "reconstruct", "fallback_reason": "donor absent",
        "cost_reason": None, "bytes_fetched": 10, "bytes_reused": 90, "bytes_written": 10,
        "bytes_cloned": 0, "seconds": 0.25, "reflink": False}),
    "csi_bridge": ("resident.bridge.publish", "fetch failed", {
        "digest": "sha256:" + "b" * 64, "source": "http://127.0.0.1:1/m", "code": "UNAVAILABLE",
        "error": "not found (HTTP 404)", "bytes": 0, "bytes_total": 5, "duration_seconds": 0.1}),
    "owner": ("resident.owner", "transition finished", {"transition": "t1", "result": "succeeded",
                                                        "seconds": 1.5, "path": Path("/v")}),
    "operator": ("resident.operator", "owner pod created", {"model": "ns/m", "reason": "OwnerPodCreated"}),
}


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def setup_as(component: str, stream) -> None:
    if component == "operator":
        from resident_operator.structured_logs import setup
        setup(logging.INFO, stream=stream)
    else:
        jsonlog.configure("INFO", stream=stream)


def uses_shared_configure(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.Attribute) and n.attr == "configure"
               and isinstance(n.value, ast.Name) and n.value.id == "jsonlog" for n in ast.walk(tree)) \
        or any(isinstance(n, ast.ImportFrom) and n.module in ("bundle.jsonlog", "jsonlog")
               and any(a.name == "configure" for a in n.names) for n in ast.walk(tree))


@pytest.mark.parametrize("component", sorted(RECORDS))
def test_each_component_logs_the_same_fields_and_keeps_its_extras(component, restore_logging):
    assert uses_shared_configure(REPO / STARTS[component]), STARTS[component]
    stream = io.StringIO()
    setup_as(component, stream)
    name, msg, extra = RECORDS[component]
    logging.getLogger(name).info(msg, extra=extra)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger(name).exception("it failed", extra={"attempt": 2})
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert list(first)[:4] == list(jsonlog.BASE_FIELDS)
    assert (first["level"], first["logger"], first["msg"]) == ("info", name, msg)
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert {k: first[k] for k in extra} == json.loads(json.dumps(extra, default=str))
    assert set(first) == set(jsonlog.BASE_FIELDS) | set(extra)
    assert second["attempt"] == 2 and "ValueError: boom" in second["exc"]


def test_no_component_carries_its_own_formatter():
    formatters = []
    for component in COMPONENTS:
        for path in (REPO / component).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                        "Formatter" in ast.unparse(b) for b in node.bases):
                    formatters.append(f"{path.relative_to(REPO)}:{node.name}")
    assert formatters == ["bundle/jsonlog.py:JSONLineFormatter"]


ENTRY_POINT_PACKAGES = (*COMPONENTS, "localcluster")
ROOT_LOGGER_SETUP = ("basicConfig", "captureWarnings", "addHandler", "fileConfig", "dictConfig")


def python_files():
    yield REPO / "resident_cli.py"
    for package in ENTRY_POINT_PACKAGES:
        yield from (REPO / package).rglob("*.py")


def test_logging_is_set_up_in_one_place():
    """Every entry point calls bundle.jsonlog.configure; nothing else configures logging."""
    elsewhere = []
    for path in python_files():
        if path == REPO / "bundle" / "jsonlog.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (node.attr in ROOT_LOGGER_SETUP or (
                    node.attr == "handlers" and isinstance(node.ctx, ast.Store))):
                elsewhere.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "handlers":
                elsewhere.append(f"{path.relative_to(REPO)}:{node.lineno} handlers[...] =")
    assert elsewhere == []


def test_every_component_logs_under_resident_dot():
    """Logger names are resident.<component>[.<part>]: resident.operator, not resident_operator."""
    names = {}
    for component in COMPONENTS:
        for path in (REPO / component).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "getLogger" and node.args:
                    arg = node.args[0]
                    names[f"{path.relative_to(REPO)}:{node.lineno}"] = \
                        arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg)
    wanted = {"bundle": "resident.bundle", "csi_bridge": "resident.bridge", "owner": "resident.owner",
              "operator": "resident.operator"}
    bad = {where: name for where, name in names.items()
           if not (name == wanted[where.split("/")[0]] or name.startswith(wanted[where.split("/")[0]] + "."))}
    assert names and bad == {}
