"""Kubernetes for the local cluster, built from its Go modules, once per machine and version.

``k8s.io/kubernetes`` is served by the Go module proxy as source. Its ``go.mod`` points
its staging modules (``k8s.io/api``, ``k8s.io/apiserver``, ...) at folders of its own
tree, so it cannot be built with ``go install cmd@version``; instead a module of ours
requires it at one version and replaces every staging module with the matching ``v0``
release (:mod:`localcluster.gobuild`). The staging list is read from that version's own
``go.mod``, so it follows the release.

Two versions are built, the two ends of what the chart declares (``kubeVersion``):
:data:`NEWEST` runs everything, :data:`OLDEST` runs the cluster test layer (API server
only). ``RESIDENT_KUBERNETES_VERSION`` picks the version a process uses. The binaries
carry their version (``kubectl version``, a Node's ``kubeletVersion``), set by
``-ldflags`` as the release build does. etcd is Debian's ``etcd-server``.

Cached under ``$RESIDENT_CACHE/kubernetes-<version>/bin``; the first build of the six
commands takes about 20 minutes on 2 cores and writes its output to
``$RESIDENT_CACHE/logs/kubernetes-build.log`` while the screen shows its progress.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

from .gobuild import GoBuild, cache_root, ensure_built, go_env, logs_dir
from .progress import run_logged

log = logging.getLogger(__name__)

NEWEST = "1.37.2"
OLDEST = "1.34.4"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
NODE = ("kubelet", "kube-proxy")
BUILD_PACKAGES = ("etcd-server", "openssl")
# staging modules that are examples, not parts of any command, and not published as v0 releases
UNPUBLISHED_STAGING = ("k8s.io/sample-",)

__all__ = ["NEWEST", "OLDEST", "CONTROL_PLANE", "NODE", "apt_install", "cache_root", "bin_dir",
           "ensure_binaries", "kubernetes_version", "logs_dir"]


def kubernetes_version() -> str:
    """The version this process runs: ``RESIDENT_KUBERNETES_VERSION``, else the newest."""
    return os.environ.get("RESIDENT_KUBERNETES_VERSION") or NEWEST


def bin_dir(version: str | None = None) -> Path:
    return cache_root() / f"kubernetes-{version or kubernetes_version()}" / "bin"


def apt_install(packages: tuple[str, ...] | list[str]) -> None:
    """Install Debian packages that are missing (dpkg says so); no-op when all are there."""
    missing = [p for p in packages if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True
    ).stdout != "install ok installed"]
    if not missing:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_logged(["sh", "-ec", 'apt-get update && apt-get install -y --no-install-recommends "$@"', "apt",
                *missing], logs_dir() / "apt.log", f"installing Debian packages: {' '.join(missing)}", env=env)


def staging_modules(version: str) -> list[str]:
    """The staging modules that ``k8s.io/kubernetes@v<version>`` replaces with its own folders."""
    done = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"],
                          capture_output=True, text=True, env=go_env(), cwd=cache_root())
    if done.returncode:
        raise RuntimeError(f"cannot fetch k8s.io/kubernetes@v{version} from the Go module proxy: "
                           f"{done.stdout.strip()} {done.stderr.strip()}")
    go_mod = Path(json.loads(done.stdout)["GoMod"]).read_text()
    staged = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", go_mod, re.MULTILINE)
    return [m for m in staged if not m.startswith(UNPUBLISHED_STAGING)]


def kubernetes_build(version: str) -> GoBuild:
    major, minor = version.split(".")[:2]
    stamp = {"gitVersion": f"v{version}", "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    ldflags = " ".join(["-s -w"] + [f"-X k8s.io/component-base/version.{k}={v}" for k, v in stamp.items()]
                       + [f"-X k8s.io/client-go/pkg/version.{k}={v}" for k, v in stamp.items()])
    return GoBuild(
        name=f"kubernetes-{version}",
        requires={"k8s.io/kubernetes": f"v{version}"},
        replaces={m: f"{m} v0.{minor}.{version.split('.')[2]}" for m in staging_modules(version)},
        commands={c: f"k8s.io/kubernetes/cmd/{c}" for c in CONTROL_PLANE + NODE},
        ldflags=ldflags, log="kubernetes-build.log",
        what=f"building Kubernetes {version} from Go modules (first run on this machine, about 20 min)",
    )


def ensure_binaries(components: tuple[str, ...] = CONTROL_PLANE, version: str | None = None) -> Path:
    """Return the directory holding the requested binaries of ``version``, building them if needed."""
    apt_install(BUILD_PACKAGES)
    version = version or kubernetes_version()
    out = bin_dir(version)
    if all((out / c).exists() for c in components):
        return out
    return ensure_built(kubernetes_build(version), components)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m localcluster.binaries",
                                     description="Build (or find) the local cluster's Kubernetes binaries.")
    parser.add_argument("--version", default=None, help=f"default: $RESIDENT_KUBERNETES_VERSION or {NEWEST}")
    parser.add_argument("--control-plane-only", action="store_true", help="only what the cluster layer needs")
    args = parser.parse_args()
    from bundle.jsonlog import configure
    configure(logging.INFO)
    print(ensure_binaries(CONTROL_PLANE if args.control_plane_only else CONTROL_PLANE + NODE, args.version))
