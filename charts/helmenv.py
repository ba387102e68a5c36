"""Where Helm runs for this repository: the real Helm library, in its own Python.

The chart is linted, installed, upgraded and uninstalled with Helm's own Go library, as
shipped inside the ``helm-sdkpy`` wheel. That wheel declares ``Requires-Python >= 3.12``
while the project runs on 3.11, so it does not go into the project's venv. Instead this
module keeps one small, separate venv per pinned helm-sdkpy version,
``$RESIDENT_CACHE/helm-venv-<version>`` (default cache ``/var/cache/resident``), created on
first use from a Python that the wheel accepts, and runs each Helm action there as a
subprocess (:mod:`charts.helm_action`), JSON in and JSON out.

This is the one place that choice lives. The interpreter is, in order:
``$RESIDENT_HELM_PYTHON``; ``python3.12`` or ``python3.13`` on ``PATH``; a pyenv 3.12 or
3.13 under ``$PYENV_ROOT`` (default ``~/.pyenv``). Without one, :class:`HelmUnavailable`
says how to provide it. docs/install.md describes the same.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HELM_SDKPY_VERSION = "0.1.32"
ACTION_SCRIPT = Path(__file__).resolve().with_name("helm_action.py")
CHART_DIR = Path(__file__).resolve().parent / "resident"


class HelmUnavailable(RuntimeError):
    """No Python >= 3.12 to run helm-sdkpy in, or its venv could not be made."""


class HelmFailed(RuntimeError):
    """A Helm action ran and failed (lint errors, rejected values, API errors)."""

    def __init__(self, action: str, kind: str, message: str):
        super().__init__(f"helm {action} failed: {kind}: {message}")
        self.action, self.kind, self.message = action, kind, message


def cache_dir() -> Path:
    return Path(os.environ.get("RESIDENT_CACHE", "/var/cache/resident"))


def venv_dir() -> Path:
    return cache_dir() / f"helm-venv-{HELM_SDKPY_VERSION}"


def _accepts(python: str) -> bool:
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def find_python() -> str:
    """The interpreter the helm venv is built from (see the module docstring)."""
    explicit = os.environ.get("RESIDENT_HELM_PYTHON")
    if explicit:
        if not _accepts(explicit):
            raise HelmUnavailable(f"RESIDENT_HELM_PYTHON={explicit!r} is not a runnable Python >= 3.12")
        return explicit
    candidates = [shutil.which(name) for name in ("python3.12", "python3.13")]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for minor in ("3.12", "3.13"):
        candidates += sorted(glob.glob(f"{pyenv}/versions/{minor}.*/bin/python{minor}"))
    for python in candidates:
        if python and _accepts(python):
            return python
    raise HelmUnavailable(
        "helm-sdkpy needs Python >= 3.12 and none was found (tried python3.12, python3.13 and "
        f"{pyenv}/versions/3.1[23].*); install one (e.g. `pyenv install 3.12`) or point "
        "RESIDENT_HELM_PYTHON at it")


def ensure_venv() -> Path:
    """The helm venv's python, creating the venv on first use (idempotent).

    Creation holds a lock file in the cache, so two test sessions on one machine do not
    build the same venv at once; the stamp is written last, so a half-made venv is redone.
    """
    venv = venv_dir()
    python = venv / "bin" / "python"
    stamp = venv / ".resident-helm-installed"
    if stamp.exists() and python.exists():
        return python
    base = find_python()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and python.exists():  # made by another process meanwhile
            return python
        steps = [[base, "-m", "venv", "--clear", str(venv)],
                 [str(python), "-m", "pip", "install", "-q", f"helm-sdkpy=={HELM_SDKPY_VERSION}"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise HelmUnavailable(f"making the helm venv failed: {' '.join(step)}\n{done.stderr[-2000:]}")
        stamp.write_text(HELM_SDKPY_VERSION + "\n")
    return python


class Helm:
    """Helm actions against one kubeconfig and namespace, through the helm venv."""

    def __init__(self, kubeconfig: str | None = None, namespace: str = "default",
                 timeout: float = 300.0):
        self.kubeconfig, self.namespace, self.timeout = kubeconfig, namespace, timeout
        self.python = ensure_venv()

    def run(self, action: str, **request: Any) -> Any:
        body = {"action": action, "namespace": self.namespace, "kubeconfig": self.kubeconfig,
                **request}
        done = subprocess.run([str(self.python), str(ACTION_SCRIPT)], input=json.dumps(body),
                              capture_output=True, text=True, timeout=self.timeout)
        try:
            answer = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise HelmFailed(action, "NoAnswer", f"exit {done.returncode}; stderr: "
                             f"{done.stderr[-2000:]}") from None
        if not answer.get("ok"):
            raise HelmFailed(action, answer.get("kind", "Error"), answer.get("error", ""))
        return answer["result"]

    def lint(self, chart: Path = CHART_DIR) -> dict[str, Any]:
        return self.run("lint", chart=str(chart))

    def install(self, release: str, values: dict | None = None, chart: Path = CHART_DIR,
                **options: Any) -> dict[str, Any]:
        return self.run("install", release=release, chart=str(chart), values=values or {},
                        options=options)

    def upgrade(self, release: str, values: dict | None = None, chart: Path = CHART_DIR,
                **options: Any) -> dict[str, Any]:
        return self.run("upgrade", release=release, chart=str(chart), values=values or {},
                        options=options)

    def uninstall(self, release: str) -> dict[str, Any]:
        return self.run("uninstall", release=release)

    def status(self, release: str) -> dict[str, Any]:
        return self.run("status", release=release)

    def list(self) -> list[dict[str, Any]]:
        return self.run("list")


def main(argv: list[str] | None = None) -> int:
    """``python -m charts.helmenv [lint]``: make the helm venv, optionally lint the chart."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m charts.helmenv [lint]\n\nCreate (once) the helm-sdkpy venv "
              f"at {venv_dir()} and print its python; with 'lint', lint charts/resident.")
        return 0
    print(ensure_venv())
    if argv[:1] == ["lint"]:
        print(json.dumps(Helm().lint(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
