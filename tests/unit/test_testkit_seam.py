"""Test-only code lives in ``testkit/``, which the image does not install and nothing it
runs imports; the bridge's crash points need the seam to arm them."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

import pytest

from csi_bridge import checkpoints
from testkit import crash_points

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("bundle", "csi_bridge", "owner", "operator/resident_operator", "localcluster")


def wheel_patterns() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["packages"]["find"]["include"]


def test_the_wheel_and_so_the_image_leaves_testkit_out():
    assert not any(fnmatch.fnmatch(name, pattern) for pattern in wheel_patterns()
                   for name in ("testkit", "testkit.bridge", "testkit.crash_points"))
    assert all(any(fnmatch.fnmatch(Path(p).name, pattern) for pattern in wheel_patterns())
               for p in SHIPPED)


def test_nothing_shipped_imports_testkit():
    found = []
    for path in [REPO / "resident_cli.py", *(f for p in SHIPPED for f in (REPO / p).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "testkit"]
    assert found == []


def test_crash_points_do_nothing_until_the_seam_arms_one():
    calls = []
    checkpoints.reached("publish:after-lease")          # nothing installed: nothing happens
    checkpoints.install(calls.append)
    try:
        checkpoints.reached("stage:after-link")
    finally:
        checkpoints.install(None)
    assert calls == ["stage:after-link"]
    with pytest.raises(ValueError, match="not a crash point"):
        crash_points.arm("publish:never")
    shipped = ast.parse((REPO / "csi_bridge" / "checkpoints.py").read_text())
    assert not [n for n in ast.walk(shipped) if isinstance(n, (ast.Import, ast.ImportFrom))
                and "os" in [a.name for a in n.names] + [getattr(n, "module", None)]]
