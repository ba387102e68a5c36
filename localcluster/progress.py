"""What a person watching the demo (or a first run) sees: one line per step with the time
since the run began, and long commands whose output goes to a log file.

A step line reads ``[ 12.3s] cluster up``. The clock starts at ``RESIDENT_T0`` (epoch
seconds; ``scripts/demo`` sets it before ``scripts/bootstrap`` runs, so the shell's lines
and Python's share one clock), else when this module is imported.

:func:`run_logged` runs a command whose output is noise unless it fails (``apt-get``,
the first-run Kubernetes build): everything it prints goes to a log file, and the screen
gets its progress instead. On a terminal one line is rewritten in place every second
(elapsed time and the log's last line); elsewhere (CI, a pipe) a line every ``every``
seconds. When it ends, one line says it is done and how long it took; when it fails,
:class:`CommandFailed` carries the log's last lines and its path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

T0 = float((os.environ.get("RESIDENT_T0") or str(time.time())).replace(",", "."))  # bash's $EPOCHREALTIME
TAIL_LINES = 30


class CommandFailed(RuntimeError):
    """A logged command exited non-zero; the message holds the log's tail."""


def elapsed() -> float:
    return time.time() - T0


def stamp(text: str, out: TextIO | None = None) -> None:
    """Print one step line: ``[ 12.3s] text``."""
    print(f"[{elapsed():6.1f}s] {text}", file=out or sys.stdout, flush=True)


def detail(text: str, out: TextIO | None = None) -> None:
    """Print lines that belong to the step above, indented under its text."""
    for line in text.rstrip("\n").splitlines():
        print(f"          {line}", file=out or sys.stdout, flush=True)


def duration(seconds: float) -> str:
    """``42.0s`` under a minute, else ``6m05s``."""
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def last_line(log: Path, limit: int = 200) -> str:
    """The log's last non-empty line (read from its end), shortened to ``limit`` characters."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return ""
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
        return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


def run_logged(argv: list[str], log: Path, what: str, *, every: float = 30.0, out: TextIO | None = None,
               tty: bool | None = None, **popen) -> float:
    """Run ``argv`` with its output appended to ``log``, showing progress as ``what``;
    return the seconds it took. ``popen`` goes to :class:`subprocess.Popen` (cwd, env)."""
    out = out or sys.stdout
    tty = out.isatty() if tty is None else tty
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(log, "ab") as sink:
        sink.write(f"\n### {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        sink.flush()
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **popen)
    shown = False
    next_line = began + every
    while proc.poll() is None:
        time.sleep(min(1.0, every) if tty else min(0.2, every))
        now = time.monotonic()
        if tty:
            width = shutil.get_terminal_size((120, 20)).columns
            text = f"[{elapsed():6.1f}s] {what}: {duration(now - began)}  {last_line(log)}"
            print("\r" + text[:width - 1].ljust(width - 1), end="", file=out, flush=True)
            shown = True
        elif now >= next_line and proc.poll() is None:
            stamp(f"{what}: {duration(now - began)} so far; log: {last_line(log)}", out)
            next_line = now + every
    seconds = time.monotonic() - began
    if tty and shown:
        print("\r" + " " * (shutil.get_terminal_size((120, 20)).columns - 1) + "\r", end="", file=out, flush=True)
    if proc.returncode != 0:
        raise CommandFailed(f"{what} failed (exit {proc.returncode}) after {duration(seconds)}; "
                            f"the last lines of {log}:\n{tail(log)}")
    stamp(f"{what}: done in {duration(seconds)} (log: {log})", out)
    return seconds
