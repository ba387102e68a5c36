"""The torch layer of the owner-torch image: the ``torch`` extra, on top of the base layer.

The base layer (:mod:`localcluster.rootfs`) has the project's own dependencies; this layer
adds what the owner's torch backend needs (``pip install 'resident[torch]'``: torch,
transformers, tokenizers and what they pull in). The host's pip downloads the wheels with
the base's installed versions as constraints, so a distribution the base already has is
the same version and stays out of this layer (nothing is overwritten, no whiteouts). The
rest is installed with ``pip install --no-deps --target`` into a directory whose contents
go under the venv's site-packages. Console scripts (``transformers``, ``torchrun``) are
left out: their launchers would name the host's Python, and the owner only imports.

torch comes from ``torch==2.13.0`` as pinned in pyproject.toml, which pip resolves to the
CPU build on this machine's disk. A wheelhouse holding anything else (a torch build
without ``+cpu``, CUDA libraries, triton) is refused: the layer would be several GiB and
the local node has no card. Files keep the mtimes pip gave them, so the ``.pyc`` files
pip compiled stay valid on the image's read-only root filesystem.
"""

from __future__ import annotations

import logging
import re
import subprocess
import tarfile
import tempfile
import tomllib
from pathlib import Path, PurePosixPath

from .rootfs import RootfsError, download_wheelhouse

log = logging.getLogger(__name__)

EXTRA = "torch"
GPU_ONLY = re.compile(r"^(nvidia[-_]|triton[-_]|cuda[-_])", re.IGNORECASE)


def torch_requirements(pyproject: Path) -> list[str]:
    """The requirements of the ``torch`` extra in a pyproject.toml."""
    try:
        extras = tomllib.loads(pyproject.read_text()).get("project", {}).get("optional-dependencies", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RootfsError(f"cannot read the {EXTRA!r} extra from {pyproject}: {e}") from e
    deps = extras.get(EXTRA)
    if not isinstance(deps, list) or not deps or not all(isinstance(d, str) for d in deps):
        raise RootfsError(f"{pyproject} has no [project.optional-dependencies] {EXTRA} list")
    return sorted(deps)


def _dist_name(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "-", wheel.name.split("-", 1)[0]).lower()


def new_wheels(wheelhouse: Path, base_freeze: list[str]) -> list[Path]:
    """The wheels of distributions the base does not have; refuses any GPU build."""
    have = {re.sub(r"[-_.]+", "-", line.split("==", 1)[0]).lower() for line in base_freeze}
    wheels = sorted(wheelhouse.glob("*.whl"))
    gpu = [w.name for w in wheels if GPU_ONLY.match(w.name)
           or (_dist_name(w) == "torch" and "+cpu" not in w.name)]
    if gpu:
        raise RootfsError(f"the torch wheelhouse holds GPU builds {gpu}; the local node runs the CPU "
                          f"build only (is torch pinned to a version whose +cpu wheel pip can find?)")
    if not any(_dist_name(w) == "torch" for w in wheels):
        raise RootfsError(f"no torch wheel in {wheelhouse}")
    return [w for w in wheels if _dist_name(w) not in have]


def build_torch_layer_tar(out_tar: Path, requirements: list[str], base_freeze: list[str],
                          purelib: str, pip: Path) -> list[str]:
    """Write the torch layer's tar at ``out_tar``; return the distributions it installs."""
    site = PurePosixPath(purelib.lstrip("/"))
    with tempfile.TemporaryDirectory(prefix="resident-torch-layer-") as tmp:
        work = Path(tmp)
        (work / "base.txt").write_text("\n".join(base_freeze) + "\n")
        download_wheelhouse(requirements, work / "wheels", pip, constraints=work / "base.txt")
        wheels = new_wheels(work / "wheels", base_freeze)
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
