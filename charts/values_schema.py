"""values.schema.json, derived from the documented values.yaml.

values.yaml is where a value is explained: each key has a ``# -- <description>`` comment
right above it. The schema Helm validates values against is generated from that file, so
the two cannot drift: the type and default of every key come from values.yaml, its
description from the comment, and the constraints a default cannot show (enums, port
ranges, non-root user ids, list item shapes) from :data:`CONSTRAINTS` below. Objects
whose defaults list their keys are closed (``additionalProperties: false``), so a typo
such as ``bridge.hostNetwrok`` is rejected by ``helm install`` instead of being ignored;
empty maps (nodeSelector, annotations) and resource blocks stay open.

``python -m charts.values_schema`` rewrites the schema; ``--check`` fails when it is
stale, and a unit test does the same.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "resident"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"

PORT = {"minimum": 1, "maximum": 65535}
NON_ROOT_ID = {"minimum": 1}
POSITIVE_SECONDS = {"type": "number", "exclusiveMinimum": 0}
LOG_LEVEL = {"enum": ["DEBUG", "INFO", "WARNING", "ERROR"]}
BIND_ADDRESS = {"pattern": "^([0-9.]+|[0-9a-fA-F:]+)?$"}  # empty: the Pod IP
ABSOLUTE_PATH = {"pattern": "^/", "minLength": 2}
NAMED_ITEMS = {"items": {"type": "object", "required": ["name"],
                         "properties": {"name": {"type": "string", "minLength": 1}}}}
OPEN = {"additionalProperties": True}
PERCENT = {"type": "number", "exclusiveMinimum": 0, "maximum": 100}

CONSTRAINTS: dict[str, dict[str, Any]] = {
    "image.repository": {"minLength": 1},
    "image.pullPolicy": {"enum": ["IfNotPresent", "Always", "Never"]},
    "imagePullSecrets": NAMED_ITEMS,
    "operator.logLevel": {"enum": ["DEBUG", "INFO"]},
    "operator.replicas": {"minimum": 1, "maximum": 5},
    "operator.bindAddress": BIND_ADDRESS,
    "operator.healthPort": PORT,
    "operator.metricsPort": PORT,
    "operator.owner.timeoutSeconds": POSITIVE_SECONDS,
    "operator.owner.nodeLossToleranceSeconds": {"type": "integer", "minimum": 0},
    "operator.owner.spread.maxSkew": {"type": "integer", "minimum": 1},
    "operator.owner.spread.whenUnsatisfiable": {"enum": ["ScheduleAnyway", "DoNotSchedule"]},
    "operator.resyncSeconds": POSITIVE_SECONDS,
    "operator.resyncPassesPerSecond": {"type": "number", "exclusiveMinimum": 0},
    "operator.sweepSeconds": POSITIVE_SECONDS,
    "operator.sweepShare": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "operator.deleteGraceSeconds": POSITIVE_SECONDS,
    "operator.extraEnv": NAMED_ITEMS,
    "operator.watchNamespaces": {"items": {"type": "string", "minLength": 1}},
    "operator.owner.networkPolicy.operatorNamespaceLabels": OPEN,
    "operator.resources": OPEN,
    "operator.resources.requests": OPEN,
    "operator.resources.limits": OPEN,
    "operator.tolerations": {"items": {"type": "object"}},
    "operator.runAsUser": NON_ROOT_ID,
    "operator.runAsGroup": NON_ROOT_ID,
    "bridge.logLevel": LOG_LEVEL,
    "bridge.gc.highWaterPercent": PERCENT,
    "bridge.gc.lowWaterPercent": PERCENT,
    "bridge.gc.highWaterBytes": {"minimum": 0},
    "bridge.gc.lowWaterBytes": {"minimum": 0},
    "bridge.gc.intervalSeconds": POSITIVE_SECONDS,
    "bridge.bindAddress": BIND_ADDRESS,
    "bridge.kubeletDir": ABSOLUTE_PATH,
    "bridge.storeDir": ABSOLUTE_PATH,
    "bridge.authorize": {"enum": ["api", "deny", "static", "allow-any"]},
    "bridge.metricsPort": PORT,
    "bridge.publishWaitSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 115},
    "bridge.socketGroup": NON_ROOT_ID,
    "bridge.registration.mode": {"enum": ["builtin", "sidecar"]},
    "bridge.registration.registrar.image": {"minLength": 1},
    "bridge.livenessProbe.image": {"minLength": 1},
    "bridge.livenessProbe.port": PORT,
    "bridge.resources": OPEN,
    "bridge.resources.requests": OPEN,
    "bridge.resources.limits": OPEN,
    "bridge.tolerations": {"items": {"type": "object"}},
    "bridge.extraEnv": NAMED_ITEMS,
    "bridge.sidecarUser": NON_ROOT_ID,
    "metrics.discovery": {"enum": ["auto", "monitors", "annotations", "none"]},
    "metrics.monitors.interval": {"pattern": "^[0-9]+(ms|s|m|h)$"},
    "metrics.dashboard.labels": OPEN,
}

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?:\s|$)")
DOC_START = "# -- "


class ValuesDocError(ValueError):
    """values.yaml has a key without a ``# --`` comment, or a constraint names no key."""


def comments(text: str, values: dict[str, Any]) -> dict[str, str]:
    """Dotted key path -> its ``# --`` description (continuation ``#`` lines joined)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(DOC_START):
            pending = [stripped[len(DOC_START):]]
            continue
        if stripped.startswith("#") and pending is not None:
            pending.append(stripped.lstrip("#").strip())
            continue
        match = KEY_LINE.match(line)
        if not match:
            if stripped and not stripped.startswith("#"):
                pending = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = [k for _, k in stack]
        if not isinstance(_lookup(values, parent), dict):
            pending = None  # a key inside a list item: part of a value, not documented here
            continue
        path = ".".join(parent + [match["key"]])
        if not pending:
            raise ValuesDocError(f"values.yaml line {number}: key {path!r} has no '# --' comment above it")
        out[path] = " ".join(pending)
        stack.append((indent, match["key"]))
        pending = None
    return out


def _lookup(values: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise ValuesDocError(f"unsupported default {value!r} ({type(value).__name__})")


def _node(path: str, value: Any, docs: dict[str, str], used: set[str]) -> dict[str, Any]:
    node: dict[str, Any] = {"type": _type(value)}
    if path:
        node["description"] = docs[path]
    if isinstance(value, dict):
        if value:
            node["additionalProperties"] = False
            node["properties"] = {k: _node(f"{path}.{k}" if path else k, v, docs, used)
                                  for k, v in value.items()}
        else:
            node["additionalProperties"] = True
    else:
        node["default"] = value
    if path in CONSTRAINTS:
        used.add(path)
        node.update(CONSTRAINTS[path])
    return node


def build(text: str | None = None) -> dict[str, Any]:
    """The schema for a values.yaml text (the chart's by default)."""
    text = VALUES.read_text() if text is None else text
    values = yaml.safe_load(text) or {}
    docs = comments(text, values)
    used: set[str] = set()
    schema = {"$schema": "http://json-schema.org/draft-07/schema#",
              "title": "Values of the Resident Helm chart (generated from values.yaml "
                       "by `python -m charts.values_schema`)",
              **_node("", values, docs, used)}
    unknown = sorted(set(CONSTRAINTS) - used)
    if unknown:
        raise ValuesDocError(f"constraints name keys that values.yaml does not have: {unknown}")
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m charts.values_schema [--check]\n\nRegenerate "
              "charts/resident/values.schema.json from values.yaml (types, defaults, the "
              "'# --' comments) and the constraints in charts/values_schema.py. --check "
              "exits 1 if the checked-in schema is stale.")
        return 0
    want = render(build())
    if "--check" in argv:
        if not SCHEMA.exists() or SCHEMA.read_text() != want:
            print("stale: charts/resident/values.schema.json (run python -m charts.values_schema)")
            return 1
        return 0
    SCHEMA.write_text(want)
    print("wrote charts/resident/values.schema.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
