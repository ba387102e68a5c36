"""``bundle`` is the domain core: it imports none of the components built on it."""

from __future__ import annotations

import ast
from pathlib import Path

BUNDLE = Path(__file__).resolve().parents[2] / "bundle"
FORBIDDEN = ("csi_bridge", "owner", "resident_operator", "operator", "kopf", "kubernetes", "grpc")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_bundle_imports_no_component_and_no_cluster_library():
    offenders = {
        f"{p.relative_to(BUNDLE.parent)}: {name}"
        for p in BUNDLE.rglob("*.py")
        for name in imported_modules(p)
        if name.split(".")[0] in FORBIDDEN
    }
    assert not offenders, sorted(offenders)


def test_plan_is_pure():
    """The planner is imported by the operator: no store, no I/O modules."""
    names = imported_modules(BUNDLE / "plan.py")
    assert not names & {"os", "sqlite3", "subprocess", "shutil", "socket", "requests"}
