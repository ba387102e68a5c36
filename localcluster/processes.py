"""Child processes that are always stopped: by PID, process group first, on every exit path.

Every server the local cluster starts goes through :class:`ProcessGroup`. Each child runs
in its own session (so a terminal's Ctrl-C does not race our shutdown), its output goes
to a log file, and :meth:`ProcessGroup.stop` stops them one at a time in reverse start
order: SIGTERM, a wait, then SIGKILL if it is still there. ``stop`` also runs at interpreter exit and on SIGTERM, so
a failing test or an interrupted demo leaves no process behind.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` free loopback ports, all different: each is held until all are chosen (ports
    chosen one after another may repeat, and SeaweedFS once got the same port for two of
    its servers and died with "address already in use")."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class ProcessGroup:
    log_dir: Path
    children: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    envs: dict[str, dict | None] = field(default_factory=dict)   # each child's environment, for restart

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, lambda *_: (self.stop(), os._exit(143)))

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        out.close()
        self.children.append((name, proc))
        self.envs[name] = env
        log.info("started %s pid=%d", name, proc.pid)
        return proc

    def restart(self, name: str, down_seconds: float = 0.0, sig: int = signal.SIGTERM) -> subprocess.Popen:
        """Stop the child ``name`` (``sig``, then SIGKILL) and start it again, same argv and
        environment."""
        i, proc = next((i, p) for i, (n, p) in enumerate(self.children) if n == name)
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        time.sleep(down_seconds)
        self.children.pop(i)
        fresh = self.start(name, list(proc.args), env=self.envs.get(name))
        self.children.insert(i, self.children.pop())   # keep the start order for stop()
        return fresh

    def check_alive(self) -> None:
        for name, proc in self.children:
            if proc.poll() is not None:
                tail = self.log_tail(name)
                raise RuntimeError(f"{name} exited with {proc.returncode}; last log lines:\n{tail}")

    def await_http(self, url: str, what: str, timeout: float, ready=lambda answer: True) -> None:
        """Poll ``url`` until it answers (and ``ready(answer)``), while every child still
        runs; RuntimeError with the log's last lines after ``timeout`` s."""
        import requests

        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                if ready(requests.get(url, timeout=1)):
                    return
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                tails = "\n".join(self.log_tail(name) for name, _ in self.children)
                raise RuntimeError(f"{what} did not answer {url} in {timeout:.0f} s; last log lines:\n{tails}")
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the children one at a time, the last started first, each given ``timeout``
        after SIGTERM: a server's graceful shutdown may need what started before it (the
        API server writes to etcd as it leaves)."""
        for name, proc in reversed(self.children):
            if proc.poll() is not None:
                continue
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; killing", name, proc.pid)
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self.children.clear()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
