"""The base layer of the project image: a minimal Debian root filesystem with Python and the
project's PyPI dependencies, built with ``mmdebstrap`` from Debian's registry.

``mmdebstrap --variant=essential`` installs only the Essential packages plus what we
name (python3, python3-venv, mount, ca-certificates), without Recommends, with merged /usr and without man
pages, docs (copyright files stay), locales or apt lists. A customize hook then makes a
virtualenv at ``/opt/resident`` inside the new root and installs the project's
dependencies into it from a wheelhouse downloaded on the host (``pip download`` with the
host's pip, so the chroot needs no network), and adds the non-root ``resident`` user
(10001:10001) that the Helm chart runs the operator and owners as. The project itself is *not* in this layer:
it changes often and goes in a small layer of its own (:mod:`localcluster.wheel_layer`).
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import tempfile
import tomllib
from pathlib import Path

log = logging.getLogger(__name__)

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("python3", "python3-venv", "mount", "ca-certificates", "libstdc++6")
# the non-root user the chart runs the operator and owners as (runAsUser/runAsGroup)
USER_ID = 10001
VENV = "/opt/resident"
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
)
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"


class RootfsError(RuntimeError):
    """The base root filesystem could not be built; the message says which step failed."""


def python_requirements(pyproject: Path) -> list[str]:
    """The ``[project] dependencies`` of a pyproject.toml, as pip requirement strings."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RootfsError(f"cannot read dependencies from {pyproject}: {e}") from e
    deps = data.get("project", {}).get("dependencies")
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise RootfsError(f"{pyproject} has no [project] dependencies list")
    return sorted(deps)


def download_wheelhouse(requirements: list[str], dest: Path, pip: Path, constraints: Path | None = None,
                        deps: bool = True) -> None:
    """Binary wheels for ``requirements`` and all their dependencies (this CPython, amd64),
    within ``constraints`` (a pip constraints file) if given; with ``deps=False``, for
    ``requirements`` alone."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("\n".join(requirements) + "\n")
    limit = ["-c", str(constraints)] if constraints else []
    _run([str(pip), "download", "-q", "--only-binary=:all:", "-d", str(dest), "-r", str(dest / "requirements.txt"),
          *limit, *([] if deps else ["--no-deps"])], "downloading the Python dependencies")


def build_rootfs_tar(out_tar: Path, requirements: list[str], pip: Path) -> dict:
    """Build the base root filesystem as a plain tar at ``out_tar``; return facts about it.

    The facts are the venv's site-packages path (where the project layer puts its files)
    and the installed Python distributions (``pip freeze`` inside the image).
    """
    with tempfile.TemporaryDirectory(prefix="resident-rootfs-") as tmp:
        work = Path(tmp)
        wheels = work / "wheels"
        download_wheelhouse(requirements, wheels, pip)
        facts = work / "facts.json"
        inside = "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1"
        probe = ("import json, subprocess, sysconfig; print(json.dumps({'purelib': sysconfig.get_path('purelib'),"
                 " 'freeze': subprocess.run(['" + VENV + "/bin/pip', 'freeze'], capture_output=True, text=True)"
                 ".stdout.split()}))")
        hooks = [
            f'chroot "$1" {inside} python3 -m venv {VENV}',
            f'cp -a {shlex.quote(str(wheels))} "$1/tmp/resident-wheels"',
            f'chroot "$1" {inside} {VENV}/bin/pip install -q --no-index --find-links /tmp/resident-wheels'
            ' -r /tmp/resident-wheels/requirements.txt',
            f'chroot "$1" {inside} {VENV}/bin/python -c {shlex.quote(probe)} > {shlex.quote(str(facts))}',
            f'echo "resident:x:{USER_ID}:{USER_ID}::/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"',
            f'echo "resident:x:{USER_ID}:" >> "$1/etc/group"',
            'rm -rf "$1/tmp/resident-wheels" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log',
        ]
        argv = [
            "mmdebstrap", "--quiet", "--mode=root", "--variant=essential",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            "--aptopt=APT::Install-Recommends \"false\"",
            f"--hook-dir={MERGED_USR_HOOKS}",
            *[f"--dpkgopt={opt}" for opt in DPKG_OPTIONS],
            *[f"--customize-hook={hook}" for hook in hooks],
            SUITE, str(out_tar), MIRROR,
        ]
        _run(argv, "mmdebstrap (Debian root filesystem + Python dependencies)")
        try:
            return json.loads(facts.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RootfsError(f"the image's Python did not report its site-packages: {e}") from e


def _run(argv: list[str], what: str) -> None:
    log.info("run %s", " ".join(shlex.quote(a) for a in argv))
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise RootfsError(f"{what} failed with exit code {proc.returncode}:\n{tail}")
