"""The CSI project's own tools, built from their Go modules at pinned versions.

The bridge is checked by the tools every CSI driver is checked by, not by copies of them.
:data:`TOOLS` pins each one (its Go module, version and main package) in one place:

- ``csi-sanity`` (``github.com/kubernetes-csi/csi-test/v5``): the CSI conformance suite,
  run against the real bridge in the component layer (``tests/component/test_csi_sanity.py``).

A tool is built once per machine with the machine's Go and ``CGO_ENABLED=0`` (a static
binary), into ``$RESIDENT_CACHE/csi-tools/<name>-<version>/bin/<name>``, so a new version
is a new directory and later runs only check that the file exists. Each build happens in
a throw-away module next to it (``go.mod`` requiring the tool's module, a ``tools.go``
with a blank import under ``//go:build tools``, ``go mod tidy``, ``go build``): unlike
``go install pkg@version``, this also builds modules whose ``go.mod`` has ``replace``
directives. Two processes that need a tool at once build it once: the second waits on the
file lock and finds the binary. What ``go`` prints goes to ``$RESIDENT_CACHE/logs/
csi-tools-build.log``; the screen gets a progress line (:func:`localcluster.progress.run_logged`).

The sidecars (``node-driver-registrar``, ``livenessprobe``) are not here: the module proxy
this project's machines reach serves no version of either (docs/csi-bridge.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .binaries import build_lock, cache_root
from .progress import run_logged


@dataclass(frozen=True)
class Tool:
    """One Go program of the CSI project: its module, the pinned version, its main package."""

    name: str
    module: str
    version: str
    package: str

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


TOOLS = {
    "csi-sanity": Tool("csi-sanity", "github.com/kubernetes-csi/csi-test/v5", "v5.6.0",
                       "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"),
}


def tools_dir() -> Path:
    return cache_root() / "csi-tools"


def tool_path(tool: Tool) -> Path:
    return tools_dir() / tool.key / "bin" / tool.name


def build_module(tool: Tool) -> dict[str, str]:
    """The throw-away module's files that build ``tool``; pure."""
    return {
        "go.mod": f"module resident.local/build/{tool.name}\n\ngo 1.25\n\nrequire {tool.module} {tool.version}\n",
        "tools.go": f"//go:build tools\n\npackage tools\n\nimport _ \"{tool.package}\"\n",
    }


def _go_env(work: Path) -> dict[str, str]:
    return dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false -mod=mod", HOME=str(work / "home"),
                GOCACHE=str(cache_root() / "gocache"), GOTOOLCHAIN="local")


def ensure_tool(name: str) -> Path:
    """The path of the named tool's binary, building it first if this machine has none."""
    tool = TOOLS[name]
    out = tool_path(tool)
    if out.exists():
        return out
    if shutil.which("go") is None:
        raise RuntimeError(f"building {name} needs Go on PATH (the machine's go1.26)")
    with build_lock(tools_dir() / tool.key):
        if out.exists():   # another process built it while this one waited
            return out
        work = tools_dir() / tool.key / "module"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for file, text in build_module(tool).items():
            (work / file).write_text(text)
        log, env = cache_root() / "logs" / "csi-tools-build.log", _go_env(work)
        run_logged(["go", "mod", "tidy"], log, f"resolving {tool.module}@{tool.version}", cwd=work, env=env)
        partial = out.with_name(out.name + ".partial")
        out.parent.mkdir(parents=True, exist_ok=True)
        run_logged(["go", "build", "-trimpath", "-o", str(partial), tool.package], log,
                   f"building {name} {tool.version} (first run on this machine)", cwd=work, env=env)
        partial.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.csi_tools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="TOOL", help=f"tools to build (default all: {', '.join(TOOLS)})")
    args = parser.parse_args(argv)
    if unknown := set(args.names) - set(TOOLS):
        parser.error(f"unknown tool(s) {', '.join(sorted(unknown))}; known: {', '.join(TOOLS)}")
    for name in args.names or TOOLS:
        print(ensure_tool(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
