"""The demo's step lines and the progress of long logged commands (the first-run Kubernetes
build, apt), with a fake build: a shell loop that prints what it builds and sleeps."""

from __future__ import annotations

import io
import re

import pytest

from localcluster.progress import CommandFailed, duration, last_line, run_logged, stamp

FAKE_BUILD = "for target in kube-apiserver kube-scheduler kubelet; do echo \"+++ building cmd/$target\"; sleep 0.15; done"
STEP = re.compile(r"^\[ *\d+\.\ds\] ")


def test_a_step_line_leads_with_the_elapsed_time():
    out = io.StringIO()
    stamp("cluster up", out)
    assert STEP.match(out.getvalue()) and out.getvalue().endswith("] cluster up\n")


@pytest.mark.parametrize("seconds, text", [(0.04, "0.0s"), (42.04, "42.0s"), (365, "6m05s"), (3600, "60m00s")])
def test_durations_read_as_seconds_then_minutes(seconds, text):
    assert duration(seconds) == text


def test_a_long_build_shows_periodic_progress_and_logs_its_output(tmp_path):
    log, out = tmp_path / "logs" / "build.log", io.StringIO()
    seconds = run_logged(["sh", "-c", FAKE_BUILD], log, "building Kubernetes", every=0.1, out=out, tty=False)
    lines = out.getvalue().splitlines()
    assert all(STEP.match(line) for line in lines), lines
    progress, done = lines[:-1], lines[-1]
    assert len(progress) >= 2                                       # it said something while it ran
    assert all("building Kubernetes: " in line and "so far; log: +++ building cmd/" in line for line in progress)
    assert done.endswith(f"building Kubernetes: done in {duration(seconds)} (log: {log})")
    assert 0.4 < seconds < 5
    assert "+++ building cmd/kubelet" in log.read_text()              # output went to the log, not the screen
    stamps = [float(line[1:line.index("s]")]) for line in lines]
    assert stamps == sorted(stamps)


def test_on_a_terminal_one_line_is_rewritten_in_place(tmp_path):
    out = io.StringIO()
    run_logged(["sh", "-c", FAKE_BUILD], tmp_path / "build.log", "building Kubernetes", every=0.1, out=out, tty=True)
    screen = out.getvalue()
    assert screen.count("\r") >= 2 and screen.count("\n") == 1          # rewritten, then the done line
    assert "+++ building cmd/" in screen
    assert screen.splitlines()[-1].split("\r")[-1].startswith("[")


def test_a_quick_command_prints_only_its_done_line(tmp_path):
    out = io.StringIO()
    run_logged(["true"], tmp_path / "apt.log", "installing Debian packages: skopeo", every=30, out=out, tty=False)
    line, = out.getvalue().splitlines()
    assert "installing Debian packages: skopeo: done in" in line


def test_a_failed_build_says_so_with_the_log_tail(tmp_path):
    log, out = tmp_path / "build.log", io.StringIO()
    with pytest.raises(CommandFailed, match=r"(?s)building Kubernetes failed \(exit 2\).*go: missing module") as e:
        run_logged(["sh", "-c", "echo compiling; echo 'go: missing module' >&2; exit 2"], log, "building Kubernetes",
                   every=30, out=out, tty=False)
    assert str(log) in str(e.value)
    assert out.getvalue() == ""                                        # no done line for a failure


def test_last_line_reads_the_end_of_a_big_log(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("x\n" * 100_000 + "the last one\n\n")
    assert last_line(log) == "the last one"
    assert last_line(tmp_path / "none.log") == ""
    log.write_text("y" * 500 + "\n")
    assert last_line(log, limit=20) == "y" * 17 + "..."
