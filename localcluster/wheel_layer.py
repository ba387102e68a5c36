"""The project layer of the image: the project's wheel, installed into the image's venv.

The project tree is what ``git ls-files --cached --others --exclude-standard`` lists:
tracked files plus new files that are not ignored, the same set a wheel build would see.
Its *tree digest* (paths, executable bits, contents) keys the image cache, so an
unchanged tree never rebuilds.

The wheel is built from a copy of exactly those files (nothing is written into the
working tree), with ``pip wheel --no-deps``. Installing a pure-Python wheel is simple
enough to do without running anything inside the image: its files go into the venv's
site-packages, and each ``console_scripts`` entry point becomes a small launcher in
``/opt/resident/bin`` (plus a link in ``/usr/local/bin``). This layer is small, so a
changed tree costs seconds, not a new Debian root filesystem.
"""

from __future__ import annotations

import configparser
import hashlib
import io
import logging
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)


class ProjectTreeError(RuntimeError):
    """The project tree cannot be listed, hashed or built into a wheel."""


def project_files(repo: Path) -> list[str]:
    """Relative paths of the project's files (tracked or new, not ignored), sorted."""
    proc = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if proc.returncode != 0:
        raise ProjectTreeError(f"{repo} is not a git work tree: {proc.stderr.decode(errors='replace').strip()}")
    names = sorted({n for n in proc.stdout.decode().split("\0") if n})
    # a tracked file deleted in the work tree is not part of the tree; neither is a submodule
    return [n for n in names if (repo / n).is_file() or (repo / n).is_symlink()]


def tree_digest(repo: Path, files: list[str]) -> str:
    """sha256 over each file's path, executable bit and content (symlinks by target)."""
    total = hashlib.sha256()
    for name in files:
        path = repo / name
        if path.is_symlink():
            kind, content = b"l", os.readlink(path).encode()
        else:
            kind = b"x" if os.access(path, os.X_OK) else b"f"
            content = path.read_bytes()
        total.update(name.encode() + b"\0" + kind + hashlib.sha256(content).digest())
    return total.hexdigest()


def build_wheel(repo: Path, files: list[str], out_dir: Path, pip: Path) -> Path:
    """Build the project's wheel from a copy of ``files``; return the wheel's path."""
    with tempfile.TemporaryDirectory(prefix="resident-wheel-src-") as tmp:
        src = Path(tmp) / "src"
        for name in files:
            target = src / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, target, follow_symlinks=False)
        out_dir.mkdir(parents=True, exist_ok=True)
        before = set(out_dir.glob("*.whl"))
        proc = subprocess.run([str(pip), "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(out_dir)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ProjectTreeError(f"building the project wheel failed:\n{proc.stdout}{proc.stderr}")
    built = sorted(set(out_dir.glob("*.whl")) - before) or sorted(out_dir.glob("*.whl"))
    if len(built) != 1:
        raise ProjectTreeError(f"expected one wheel in {out_dir}, found {[p.name for p in built]}")
    return built[0]


def console_scripts(wheel: zipfile.ZipFile) -> dict[str, str]:
    """``name -> module:function`` from the wheel's entry_points.txt."""
    entry = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    if not entry:
        return {}
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str
    parser.read_string(wheel.read(entry[0]).decode())
    return dict(parser["console_scripts"]) if parser.has_section("console_scripts") else {}


def launcher(venv: str, target: str) -> bytes:
    module, _, function = target.strip().partition(":")
    return (f"#!{venv}/bin/python\nimport sys\nfrom {module} import {function.split('.')[0]}\n"
            f"sys.exit({function}())\n").encode()


def wheel_layer_tar(wheel_path: Path, venv: str, purelib: str, out_tar: Path) -> list[str]:
    """Write the layer tar that installs ``wheel_path`` into ``venv``; return the scripts made."""
    site = PurePosixPath(purelib.lstrip("/"))
    if not str(site).startswith(venv.strip("/") + "/"):
        raise ProjectTreeError(f"site-packages {purelib} is not inside the venv {venv}")
    with zipfile.ZipFile(wheel_path) as wheel, tarfile.open(out_tar, "w", format=tarfile.PAX_FORMAT) as tar:
        def add(member: str, data: bytes, mode: int) -> None:
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        for item in sorted(wheel.infolist(), key=lambda i: i.filename):
            if item.is_dir():
                continue
            path = PurePosixPath(item.filename)
            if path.is_absolute() or ".." in path.parts or ".data" in path.parts[0]:
                raise ProjectTreeError(f"wheel member {item.filename!r} cannot be installed by this layer builder")
            executable = (item.external_attr >> 16) & stat.S_IXUSR
            add(str(site / path), wheel.read(item), 0o755 if executable else 0o644)
        scripts = console_scripts(wheel)
        for name, target in sorted(scripts.items()):
            add(f"{venv.strip('/')}/bin/{name}", launcher(venv, target), 0o755)
            link = tarfile.TarInfo(f"usr/local/bin/{name}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, f"{venv}/bin/{name}", 0o777, 0
            tar.addfile(link)
    return sorted(scripts)
