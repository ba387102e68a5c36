"""Go commands built from their modules, once per machine, cached by version.

The local cluster's parts that are written in Go (Kubernetes, the CSI sidecars, CoreDNS)
come from the Go module proxy as source and are built here with the machine's Go. Each
build gets a throw-away module of its own under ``$RESIDENT_CACHE/<name>/module``: a
``go.mod`` that requires the wanted modules at exact versions (with ``replace`` lines
where a module, like ``k8s.io/kubernetes``, only builds with its staging modules pinned),
and a ``tools.go`` that names the command packages so ``go mod tidy`` resolves them. Then
each command is built with ``CGO_ENABLED=0`` into ``$RESIDENT_CACHE/<name>/bin``.

A binary is written under a temporary name and renamed into place, so a file that exists
is whole; later runs only check that the files exist. Builds into one cache directory take
its lock, so a demo and a test run started at once build once. The Go module and build
caches live under ``$RESIDENT_CACHE/go``, outside the repository. What ``go`` prints goes
to ``$RESIDENT_CACHE/logs/<log>``; the screen gets the step and its progress
(:func:`localcluster.progress.run_logged`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .progress import run_logged


def cache_root() -> Path:
    return Path(os.environ.get("RESIDENT_CACHE", "/var/cache/resident"))


def logs_dir() -> Path:
    return cache_root() / "logs"


@contextmanager
def build_lock(cache: Path):
    """Hold ``cache``'s build lock: one process at a time builds into that cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class GoBuild:
    """What to build: command packages from modules pinned at exact versions."""

    name: str                                  # cache folder, with the version in it
    requires: dict[str, str]                   # module path -> version
    commands: dict[str, str]                   # binary name -> command package
    replaces: dict[str, str] = field(default_factory=dict)   # module path -> "path version"
    ldflags: str = "-s -w"
    log: str = "go-build.log"
    what: str = ""                             # the progress line's text

    @property
    def bin_dir(self) -> Path:
        return cache_root() / self.name / "bin"

    def go_mod(self) -> str:
        lines = ["module resident.dev/localcluster/build", "", "go 1.26.0", ""]
        lines += [f"require {m} {v}" for m, v in sorted(self.requires.items())]
        if self.replaces:
            lines += ["", "replace ("] + [f"\t{m} => {to}" for m, to in sorted(self.replaces.items())] + [")"]
        return "\n".join(lines) + "\n"

    def tools_go(self) -> str:
        imports = "".join(f'\t_ "{p}"\n' for p in sorted(self.commands.values()))
        return f"//go:build tools\n\npackage build\n\nimport (\n{imports})\n"


def go_env() -> dict[str, str]:
    go = cache_root() / "go"
    return dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false",
                GOMODCACHE=str(go / "mod"), GOCACHE=str(go / "build"), GOTOOLCHAIN="local")


def ensure_built(build: GoBuild, wanted: tuple[str, ...] | None = None) -> Path:
    """Return ``build.bin_dir`` holding the ``wanted`` binaries (all by default), building
    the missing ones first."""
    wanted = tuple(wanted or build.commands)
    out = build.bin_dir
    if all((out / c).exists() for c in wanted):
        return out
    with build_lock(cache_root() / build.name):
        missing = [c for c in wanted if not (out / c).exists()]   # another process may have built them
        if missing:
            _build(build, missing)
    return out


def _build(build: GoBuild, missing: list[str]) -> None:
    if shutil.which("go") is None:
        raise RuntimeError("the local cluster builds its Go parts from modules and needs `go` on PATH")
    module = cache_root() / build.name / "module"
    module.mkdir(parents=True, exist_ok=True)
    (module / "go.mod").write_text(build.go_mod())
    (module / "tools.go").write_text(build.tools_go())
    log, env = logs_dir() / build.log, go_env()
    what = build.what or build.name
    run_logged(["go", "mod", "tidy"], log, f"{what}: resolving modules", cwd=module, env=env)
    out = build.bin_dir
    out.mkdir(parents=True, exist_ok=True)
    for name in missing:
        tmp = out / f".{name}.tmp"
        run_logged(["go", "build", "-trimpath", f"-ldflags={build.ldflags}", "-o", str(tmp),
                    build.commands[name]], log, f"{what}: building {name}", cwd=module, env=env)
        tmp.rename(out / name)
