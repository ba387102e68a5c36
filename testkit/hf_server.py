"""A real Hugging Face Hub-compatible server for tests: olah on 127.0.0.1, serving local git
repositories, stopped by PID.

:func:`running_hub` starts ``olah-cli`` (the ``olah`` package of the test extra) with
``offline = true`` (it never asks huggingface.co) and a ``mirrors-path`` under which each
repository is a git working tree at ``models/ORG/NAME``, its LFS objects in
``.git/lfs/objects`` as ``git lfs`` keeps them. It answers the Hub's API (``/api/models/…/tree``,
``…/refs``, ``…/revision``) and ``/ORG/NAME/resolve/REV/PATH`` from those repositories.
It gets 2 s of grace after SIGTERM, then SIGKILL.

:class:`HubRepo` is the test's own hand on a repository: write files, commit (weights
through git-lfs, as on the Hub), move or delete branches, rewrite history, and spoil an
LFS object the way a broken mirror would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from localcluster.processes import ProcessGroup, free_port

GIT_ENV = {"GIT_AUTHOR_NAME": "resident-test", "GIT_AUTHOR_EMAIL": "test@resident.dev",
           "GIT_COMMITTER_NAME": "resident-test", "GIT_COMMITTER_EMAIL": "test@resident.dev",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


def olah_binary() -> str:
    """``olah-cli``, beside this Python (the venv's bin/) or on PATH."""
    beside = Path(sys.executable).parent / "olah-cli"
    found = str(beside) if beside.exists() else shutil.which("olah-cli")
    if not found:
        raise RuntimeError("olah is not installed: pip install -e '.[test]' (the olah package)")
    return found


def require_git_lfs() -> None:
    if subprocess.run(["git", "lfs", "version"], capture_output=True).returncode != 0:
        raise RuntimeError("git-lfs is not installed: apt-get install -y git-lfs")


@contextlib.contextmanager
def running_hub(work: Path, timeout: float = 60.0):
    """olah on a free 127.0.0.1 port (see the module docstring); yields ``(endpoint,
    mirrors)``: ``http://127.0.0.1:PORT`` once it answers, and the directory under which
    :class:`HubRepo` creates repositories."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    mirrors = work / "mirrors"
    (mirrors / "models").mkdir(parents=True, exist_ok=True)
    config = work / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'repos-path = "{work / "cache"}"\n'
        f'mirrors-path = ["{mirrors}"]\n'
        'mirror-scheme = "http"\n'
        f'mirror-netloc = "127.0.0.1:{port}"\nmirror-lfs-netloc = "127.0.0.1:{port}"\n'
        "[accessibility]\noffline = true\n")
    group = ProcessGroup(work / "logs")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        group.start("olah", [olah_binary(), "-c", str(config), "--log-path", str(work / "logs")],
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        group.await_http(endpoint + "/api/whoami-v2", "olah", timeout)
        yield endpoint, mirrors
    finally:
        group.stop(timeout=2.0)


class HubRepo:
    """A model repository ``ORG/NAME`` as a git working tree olah serves."""

    def __init__(self, mirrors: Path, repo_id: str, lfs: tuple[str, ...] = ("*.safetensors",)) -> None:
        require_git_lfs()
        self.repo_id = repo_id
        self.path = mirrors / "models" / repo_id
        self.path.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        self.git("lfs", "install", "--local")
        for pattern in lfs:
            self.git("lfs", "track", pattern)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.path, check=True, capture_output=True,
                              text=True, env={**os.environ, **GIT_ENV}).stdout.strip()

    def commit(self, files: dict[str, bytes], message: str = "revision",
               remove: tuple[str, ...] = ()) -> str:
        """Write ``files`` (path → bytes), remove ``remove``, commit all; return the SHA."""
        for rel, data in files.items():
            (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.path / rel).write_bytes(data)
        for rel in remove:
            self.git("rm", "-q", rel)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def branch(self, name: str, commit: str) -> None:
        self.git("branch", "-f", name, commit)

    def forget(self, commit: str) -> None:
        """Rewrite history so that ``commit`` is in no branch and not in the object store
        (a force-push that dropped it): main goes back to its parent."""
        self.git("reset", "-q", "--hard", f"{commit}~1")
        self.git("reflog", "expire", "--expire=now", "--all")
        self.git("gc", "-q", "--prune=now")

    def lfs_object(self, oid: str) -> Path:
        return self.path / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
