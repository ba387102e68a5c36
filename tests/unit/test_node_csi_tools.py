"""Go parts built from their modules: exact pins, the throw-away module that builds them
(with replace lines where a module needs them), a cache keyed by version, no rebuild."""

from __future__ import annotations

import re

from localcluster import gobuild
from localcluster.containerd import containerd_build
from localcluster.csi_tools import csi_sanity_build
from localcluster.gobuild import GoBuild, ensure_built


def test_every_go_part_is_pinned_to_an_exact_version_and_cached_by_it():
    for build in (csi_sanity_build(), containerd_build()):
        (module, version), = build.requires.items()
        assert re.fullmatch(r"v\d+\.\d+\.\d+", version), build
        assert version[1:] in build.name
        assert all(p == module or p.startswith(module + "/") for p in build.commands.values())


def test_the_build_module_requires_pins_replaces_and_names_the_commands():
    build = GoBuild(name="k-1.2.3", requires={"k8s.io/kubernetes": "v1.2.3"},
                    commands={"kubectl": "k8s.io/kubernetes/cmd/kubectl"},
                    replaces={"k8s.io/api": "k8s.io/api v0.2.3"})
    go_mod = build.go_mod()
    assert "require k8s.io/kubernetes v1.2.3\n" in go_mod
    assert "\tk8s.io/api => k8s.io/api v0.2.3\n" in go_mod
    assert build.tools_go().startswith("//go:build tools\n")
    assert '\t_ "k8s.io/kubernetes/cmd/kubectl"\n' in build.tools_go()


def test_a_built_binary_is_not_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("RESIDENT_CACHE", str(tmp_path))
    monkeypatch.setattr(gobuild, "run_logged", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    build = csi_sanity_build()
    assert build.bin_dir == tmp_path / build.name / "bin"
    build.bin_dir.mkdir(parents=True)
    (build.bin_dir / "csi-sanity").write_bytes(b"#!/bin/true\n")
    assert ensure_built(build) == build.bin_dir
