"""Kubernetes binaries for the local cluster, built once per machine from Debian sources.

Debian ships etcd as a binary package and Kubernetes only as a source package
(1.20.2, with its whole vendor tree). We install the build tools from Debian's
registry, unpack the source, replace the vendored reflect2 (v1.0.1 crashes Go >= 1.18
builds of kube-apiserver on the first custom-resource create), and build the
components the way ``debian/rules`` does. The result is cached outside the
repository under ``$RESIDENT_CACHE`` (default ``/var/cache/resident``), keyed by
the source version, so later runs only check that the files exist. Processes that start
at once on a fresh machine (a demo and a test run) build it once: the second waits for the
first under a file lock and finds the binaries made.

What apt and the build print goes to log files under ``$RESIDENT_CACHE/logs``
(``apt.log``, ``kubernetes-build.log``); the screen gets one line per step and, during
the 5-10 minute first build, its progress (:func:`localcluster.progress.run_logged`).
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from .progress import run_logged

log = logging.getLogger(__name__)

K8S_VERSION = "1.20.2"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
NODE = ("kubelet",)
BUILD_PACKAGES = (
    "golang-go", "etcd-server", "dpkg-dev", "rsync", "jq", "openssl",
    "golang-github-modern-go-reflect2-dev",
)
DEB_SRC = "/etc/apt/sources.list.d/resident-deb-src.sources"
REFLECT2 = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")


def cache_root() -> Path:
    return Path(os.environ.get("RESIDENT_CACHE", "/var/cache/resident"))


def bin_dir() -> Path:
    return cache_root() / f"kubernetes-{K8S_VERSION}" / "bin"


def logs_dir() -> Path:
    return cache_root() / "logs"


def _apt(script: str, args: list[str], what: str) -> None:
    """Run an apt-get shell ``script`` (``$@`` is ``args``) as one logged step."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_logged(["sh", "-ec", script, "apt", *args], logs_dir() / "apt.log", what, env=env)


def _build_step(argv: list[str], what: str, **popen) -> None:
    run_logged(argv, logs_dir() / "kubernetes-build.log", what, **popen)


def apt_install(packages: tuple[str, ...] | list[str]) -> None:
    """Install Debian packages that are missing (dpkg says so); no-op when all are there."""
    missing = [p for p in packages if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True
    ).stdout != "install ok installed"]
    if not missing:
        return
    _apt('apt-get update && apt-get install -y --no-install-recommends "$@"', missing,
         f"installing Debian packages: {' '.join(missing)}")


def _enable_deb_src() -> None:
    if Path(DEB_SRC).exists():
        return
    Path(DEB_SRC).write_text(
        "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    _apt("apt-get update", [], "updating Debian's package lists (with sources)")


def _unpack_source(work: Path) -> Path:
    tree = work / "k8s"
    if (tree / "Makefile").exists():
        return tree
    _enable_deb_src()
    work.mkdir(parents=True, exist_ok=True)
    _build_step(["apt-get", "source", "--download-only", "kubernetes"], "downloading Debian's kubernetes source",
                cwd=work)
    dsc = sorted(glob.glob(str(work / "kubernetes_*.dsc")))[-1]
    _build_step(["dpkg-source", "-x", "--skip-patches", dsc, str(tree)], "unpacking the kubernetes source", cwd=work)
    vendored = tree / "vendor/github.com/modern-go/reflect2"
    shutil.rmtree(vendored)
    vendored.mkdir()
    for f in REFLECT2.iterdir():
        if f.suffix in (".go", ".s"):
            shutil.copy2(f, vendored / f.name)
    return tree


@contextmanager
def build_lock(cache: Path):
    """Hold ``cache``'s build lock: one process at a time builds into that cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_binaries(components: tuple[str, ...] = CONTROL_PLANE) -> Path:
    """Return the directory holding the requested binaries, building them if needed."""
    apt_install(BUILD_PACKAGES)
    out = bin_dir()
    if all((out / c).exists() for c in components):
        return out
    with build_lock(cache_root() / f"kubernetes-{K8S_VERSION}"):
        _build([c for c in components if not (out / c).exists()], out)
    return out


def _build(wanted: list[str], out: Path) -> None:
    if not wanted:   # another process built them while this one waited
        return
    work = cache_root() / f"kubernetes-{K8S_VERSION}" / "src"
    tree = _unpack_source(work)
    gopath = tree / ".go/src/k8s.io"
    gopath.mkdir(parents=True, exist_ok=True)
    if not (gopath / "kubernetes").exists():
        (gopath / "kubernetes").symlink_to("../../..")
    env = dict(
        os.environ, GOPATH=str(tree / ".go"), CGO_ENABLED="0", HOME=str(work / "home"),
        GOCACHE=str(cache_root() / "gocache"), GOFLAGS="",
    )
    what = " ".join(f"cmd/{c}" for c in wanted)
    _build_step(["make", f"WHAT={what}"],
                f"building Kubernetes {K8S_VERSION} ({', '.join(wanted)}; first run on this machine, 5-10 min)",
                cwd=tree, env=env)
    out.mkdir(parents=True, exist_ok=True)
    for c in wanted:
        built = tree / "_output/local/bin/linux/amd64" / c
        tmp = out / f".{c}.tmp"
        shutil.copy2(built, tmp)
        tmp.rename(out / c)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(ensure_binaries(CONTROL_PLANE + NODE))
