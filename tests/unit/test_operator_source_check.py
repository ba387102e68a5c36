"""The source check's backoff: capped exponential, from the Degraded condition alone."""

from datetime import datetime, timezone

from resident_operator.source_check import retry_after

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()


def degraded(reason: str, status: str = "True") -> list[dict]:
    return [{"type": "Degraded", "status": status, "reason": reason,
             "lastTransitionTime": "2026-01-01T12:00:00Z"}]


def test_first_failure_retries_after_two_seconds():
    assert retry_after(None, T0) == 2.0
    assert retry_after(degraded("AsExpected", "False"), T0 + 100) == 2.0
    assert retry_after(degraded("InvalidSpec"), T0 + 100) == 2.0   # another reason: start over


def test_wait_doubles_with_the_age_of_the_failure_and_is_capped():
    waits, now = [], T0
    for _ in range(8):
        wait = retry_after(degraded("SourceUnavailable"), now)
        waits.append(wait)
        now += wait
    assert waits == [2.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert retry_after(degraded("DigestMismatch"), T0 + 5) == 5.0


def test_a_malformed_time_does_not_break_the_retry():
    assert retry_after([{"type": "Degraded", "status": "True", "reason": "DigestMismatch",
                         "lastTransitionTime": "yesterday"}], T0) == 2.0


# -- a pass's read: the shared probe of a source that is down -----------------------------
import types  # noqa: E402

import pytest  # noqa: E402

from resident_operator import source_check  # noqa: E402
from resident_operator.context import FollowUp  # noqa: E402
from resident_operator.source_check import SourceProblem, read_manifest, retry_later  # noqa: E402
from resident_operator.source_probes import SourceProbes  # noqa: E402

DIGEST = "sha256:" + "a" * 64


def pass_context(probes):
    return types.SimpleNamespace(sources=probes, follow_up=FollowUp(), body={"status": {}}, clock=lambda: T0)


def failing_read(outage: bool, calls: list):
    def read(source, digest):
        calls.append(source)
        raise SourceProblem("SourceUnavailable", f"{source}: down or missing", outage=outage)
    return read


def test_a_read_that_finds_the_server_down_waits_on_its_probe(monkeypatch):
    calls = []
    monkeypatch.setattr(source_check, "_read_manifest", failing_read(True, calls))
    ctx = pass_context(SourceProbes())
    with pytest.raises(SourceProblem):
        read_manifest(ctx, "http://h:1/m/a", DIGEST)
    assert ctx.follow_up.source_waits == [("http://h:1/m/a", "http://h:1/m/a: down or missing")]
    retry_later(ctx)
    assert ctx.follow_up.due is None          # the probe wakes it, no timer


def test_while_the_probe_is_open_no_model_reads_the_source(monkeypatch):
    calls, probes = [], SourceProbes()
    monkeypatch.setattr(source_check, "_read_manifest", failing_read(True, calls))
    probes.wait("http://h:1/m/a", "first model", "HTTP 503", now=0.0)
    ctx = pass_context(probes)
    with pytest.raises(SourceProblem) as e:
        read_manifest(ctx, "http://h:1/m/b", DIGEST)
    assert calls == [] and "waiting on its probe" in str(e.value) and "HTTP 503" in str(e.value)
    assert ctx.follow_up.source_waits == [("http://h:1/m/b", "HTTP 503")]


@pytest.mark.parametrize("source,outage", [("http://h:1/m/a", False), ("file:///missing", False),
                                           ("file:///odd", True)])
def test_an_answer_or_a_source_without_a_server_keeps_the_models_own_backoff(monkeypatch, source, outage):
    monkeypatch.setattr(source_check, "_read_manifest", failing_read(outage, []))
    ctx = pass_context(SourceProbes())
    with pytest.raises(SourceProblem):
        read_manifest(ctx, source, DIGEST)
    retry_later(ctx)
    assert ctx.follow_up.source_waits == [] and ctx.follow_up.due == 2.0
