"""The torch layer of the owner-torch image: the torch backend for the CPU, on top of the base layer.

The base layer (:mod:`localcluster.rootfs`) has the project's own dependencies; this layer
adds what the owner's torch backend needs, as ``scripts/bootstrap`` installs it: the
``torch-deps`` extra (transformers, tokenizers, torch's requirements other than CUDA, and
what they pull in), then ``torch-cpu.txt`` without dependencies (torch and only the CUDA
libraries its shared objects cannot be loaded without). The host's pip downloads the
extra's wheels with the base's installed versions as constraints, so a distribution the
base already has is the same version and stays out of this layer (nothing is overwritten,
no whiteouts). The rest is installed with ``pip install --no-deps --target`` into a
directory whose contents go under the venv's site-packages. Console scripts
(``transformers``, ``torchrun``) are left out: their launchers would name the host's
Python, and the owner only imports.

PyPI's torch is the CUDA build; its full dependency set (triton, every CUDA library) would
add gigabytes the local node, which has no card, never loads. A wheelhouse holding a GPU
distribution that ``torch-cpu.txt`` does not pin, or another torch, is refused. Files keep
the mtimes pip gave them, so the ``.pyc`` files pip compiled stay valid on the image's
read-only root filesystem.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import subprocess
import tarfile
import tempfile
import tomllib
from pathlib import Path, PurePosixPath

from .binaries import cache_root
from .rootfs import RootfsError, download_wheelhouse

log = logging.getLogger(__name__)

EXTRA = "torch-deps"
PINS = "torch-cpu.txt"
GPU_ONLY = re.compile(r"^(nvidia[-_]|triton[-_]|cuda[-_])", re.IGNORECASE)


def torch_requirements(pyproject: Path) -> list[str]:
    """The requirements of the ``torch-deps`` extra in a pyproject.toml."""
    try:
        extras = tomllib.loads(pyproject.read_text()).get("project", {}).get("optional-dependencies", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RootfsError(f"cannot read the {EXTRA!r} extra from {pyproject}: {e}") from e
    deps = extras.get(EXTRA)
    if not isinstance(deps, list) or not deps or not all(isinstance(d, str) for d in deps):
        raise RootfsError(f"{pyproject} has no [project.optional-dependencies] {EXTRA} list")
    return sorted(deps)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def torch_pins(path: Path) -> list[str]:
    """The ``name==version`` lines of ``torch-cpu.txt`` (comments and blank lines skipped)."""
    try:
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    except OSError as e:
        raise RootfsError(f"cannot read {path}: {e}") from e
    pins = [line for line in lines if line]
    bad = [line for line in pins if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!]+", line)]
    if bad:
        raise RootfsError(f"{path} must pin exact versions (name==version), not {bad}")
    if "torch" not in {_canonical(line.split("==")[0]) for line in pins}:
        raise RootfsError(f"{path} does not pin torch")
    return sorted(pins)


def _dist(wheel: Path) -> tuple[str, str]:
    name, version = wheel.name.split("-", 2)[:2]
    return _canonical(name), version


def _pinned(pins: list[str]) -> set[tuple[str, str]]:
    return {(_canonical(n), v) for n, v in (p.split("==", 1) for p in pins)}


def torch_wheelhouse() -> Path:
    """Where the wheels of ``torch-cpu.txt`` are kept, for the venv and the image alike."""
    return cache_root() / "wheels" / "torch-cpu"


def fetch_pinned_wheels(pins: list[str], wheelhouse: Path, pip: Path) -> list[Path]:
    """The wheels of ``pins`` in ``wheelhouse``, downloading only those it lacks.

    PyPI's answers here carry no caching headers, so pip's own cache keeps nothing and every
    ``pip download`` would fetch the 2.2 GiB again: the wheelhouse is what makes the second
    install (the image after the venv, a new base, a new venv) free. Wheels of other
    versions (an older pin) are deleted."""
    download_wheelhouse(pins, wheelhouse, pip, deps=False)
    pinned = _pinned(pins)
    wheels = sorted(wheelhouse.glob("*.whl"))
    for stale in [w for w in wheels if _dist(w) not in pinned]:
        stale.unlink()
    wheels = [w for w in wheels if _dist(w) in pinned]
    missing = pinned - {_dist(w) for w in wheels}
    if missing:
        raise RootfsError(f"pip downloaded no wheel for {sorted(missing)} into {wheelhouse}")
    return wheels


def new_wheels(wheels: list[Path], base_freeze: list[str], pins: list[str]) -> list[Path]:
    """The wheels of distributions the base does not have; refuses a torch or a GPU
    distribution (``nvidia-*``, ``triton``, ``cuda-*``) that is not one of ``pins``."""
    have = {_canonical(line.split("==", 1)[0]) for line in base_freeze}
    pinned = _pinned(pins)
    wheels = sorted(wheels, key=lambda w: w.name)
    unpinned = [w.name for w in wheels if (GPU_ONLY.match(w.name) or _dist(w)[0] == "torch")
                and _dist(w) not in pinned]
    if unpinned:
        raise RootfsError(f"the torch wheelhouse holds GPU builds {unpinned} that {PINS} does not pin; the "
                          f"local node has no card, and only what torch needs to load belongs in the layer")
    if not any(_dist(w)[0] == "torch" for w in wheels):
        raise RootfsError(f"no torch wheel among {[w.name for w in wheels]}")
    return [w for w in wheels if _dist(w)[0] not in have]


def build_torch_layer_tar(out_tar: Path, requirements: list[str], pins: list[str], base_freeze: list[str],
                          purelib: str, pip: Path) -> list[str]:
    """Write the torch layer's tar at ``out_tar``: ``requirements`` with their dependencies,
    then ``pins`` without; return the distributions it installs."""
    site = PurePosixPath(purelib.lstrip("/"))
    with tempfile.TemporaryDirectory(prefix="resident-torch-layer-") as tmp:
        work = Path(tmp)
        (work / "base.txt").write_text("\n".join(base_freeze) + "\n")
        download_wheelhouse(requirements, work / "wheels", pip, constraints=work / "base.txt")
        pinned = fetch_pinned_wheels(pins, torch_wheelhouse(), pip)
        wheels = new_wheels([*(work / "wheels").glob("*.whl"), *pinned], base_freeze, pins)
        target = work / "site"
        proc = subprocess.run([str(pip), "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                               *map(str, wheels)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RootfsError(f"installing the torch wheels failed:\n{proc.stdout}{proc.stderr}")

        def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            return info

        with tarfile.open(out_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            for entry in sorted(target.iterdir()):
                if entry.name != "bin":
                    tar.add(entry, str(site / entry.name), filter=as_root)
    names = [w.name.split("-", 2)[0] + "==" + w.name.split("-", 2)[1] for w in wheels]
    log.info("torch layer", extra={"distributions": names})
    return names


def main(argv: list[str] | None = None) -> int:
    """``scripts/bootstrap``'s step: fetch the pinned wheels, print the wheelhouse."""
    parser = argparse.ArgumentParser(prog="python -m localcluster.torch_layer",
                                     description="download the wheels of torch-cpu.txt (only those missing) into "
                                                 "the wheelhouse and print its path, for pip install --find-links")
    parser.add_argument("pins", type=Path, help="the torch-cpu.txt file")
    args = parser.parse_args(argv)
    try:
        fetch_pinned_wheels(torch_pins(args.pins), torch_wheelhouse(), Path(sys.executable).with_name("pip"))
    except RootfsError as e:
        print(e, file=sys.stderr)
        return 1
    print(torch_wheelhouse())
    return 0


if __name__ == "__main__":
    sys.exit(main())
