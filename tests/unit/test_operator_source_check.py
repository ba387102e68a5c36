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
