"""The CSI project's tools: one pin per tool, a cache path keyed by version, and the
throw-away module that builds a tool (also one whose go.mod has replace directives)."""

from __future__ import annotations

import re

from localcluster import csi_tools
from localcluster.csi_tools import TOOLS, Tool, build_module, ensure_tool, tool_path


def test_every_tool_is_pinned_to_an_exact_version_of_its_module():
    for name, tool in TOOLS.items():
        assert tool.name == name
        assert re.fullmatch(r"v\d+\.\d+\.\d+", tool.version), tool
        assert tool.package == tool.module or tool.package.startswith(tool.module + "/")


def test_the_build_module_requires_the_pinned_version_and_imports_the_main_package():
    tool = Tool("csi-sanity", "github.com/kubernetes-csi/csi-test/v5", "v5.6.0",
                "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity")
    files = build_module(tool)
    assert "require github.com/kubernetes-csi/csi-test/v5 v5.6.0\n" in files["go.mod"]
    assert files["tools.go"].startswith("//go:build tools\n")
    assert 'import _ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"' in files["tools.go"]


def test_a_tool_is_cached_under_resident_cache_by_version(tmp_path, monkeypatch):
    monkeypatch.setenv("RESIDENT_CACHE", str(tmp_path))
    tool = TOOLS["csi-sanity"]
    assert tool_path(tool) == tmp_path / "csi-tools" / f"csi-sanity-{tool.version}" / "bin" / "csi-sanity"


def test_a_cached_tool_is_not_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("RESIDENT_CACHE", str(tmp_path))
    monkeypatch.setattr(csi_tools, "run_logged", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    cached = tool_path(TOOLS["csi-sanity"])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"#!/bin/true\n")
    assert ensure_tool("csi-sanity") == cached
