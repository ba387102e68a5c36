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
    def read(source, digest, credentials=None):
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


# -- the model's credentials, read from its Secret ------------------------------------------
import base64  # noqa: E402

from bundle.sources import SourceCredentials  # noqa: E402
from resident_operator.source_check import model_credentials  # noqa: E402


class SecretsOf:
    """The API's answers for Secrets (the one effect model_credentials has): by name, or None."""

    def __init__(self, **secrets):
        self.secrets, self.asked = secrets, []

    def get(self, namespace, kind, name):
        self.asked.append((namespace, kind, name))
        return self.secrets.get(name)


def secret_context(kube):
    return types.SimpleNamespace(kube=kube, namespace="team-a", sources=None, follow_up=FollowUp(),
                                 body={"status": {}}, clock=lambda: T0)


def b64(text):
    return base64.b64encode(text.encode()).decode()


def test_an_s3_source_is_read_with_the_data_of_the_models_secret():
    kube = SecretsOf(reader={"data": {"AWS_ACCESS_KEY_ID": b64("AK"), "AWS_SECRET_ACCESS_KEY": b64("SK")}})
    creds = model_credentials(secret_context(kube), "s3://models/tiny", "reader")
    assert dict(creds) == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}
    assert kube.asked == [("team-a", "Secret", "reader")]   # the model's own namespace only
    assert model_credentials(secret_context(kube), "s3://models/tiny", None) is None   # anonymous
    assert model_credentials(secret_context(kube), "http://h/m", "reader") is None     # reads none
    assert len(kube.asked) == 1


def test_a_missing_or_unreadable_secret_is_credentials_unavailable(monkeypatch):
    calls = []
    monkeypatch.setattr(source_check, "_read_manifest", failing_read(False, calls))
    for kube, says in ((SecretsOf(), "does not exist"),
                       (SecretsOf(reader={"data": {"AWS_ACCESS_KEY_ID": "%%%"}}), "not base64")):
        with pytest.raises(SourceProblem) as e:
            read_manifest(secret_context(kube), "s3://models/tiny", DIGEST, "reader")
        assert e.value.blocker.reason == "CredentialsUnavailable" and says in str(e.value)
        assert "'reader'" in str(e.value) and "'team-a'" in str(e.value)
    assert calls == []   # the source is not read without the credentials it needs


def test_a_kept_manifest_is_kept_for_the_credentials_that_read_it(monkeypatch):
    reads = []

    def read(source, digest, credentials=None):
        reads.append(credentials)
        return f"manifest read as {credentials!r}"

    monkeypatch.setattr(source_check, "_kept", source_check.OrderedDict())
    monkeypatch.setattr(source_check, "_read_manifest", read)
    good = SourceCredentials({"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"})
    other = SourceCredentials({"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "nope"})
    first = source_check.fetch_manifest("s3://models/tiny", DIGEST, good)
    assert source_check.fetch_manifest("s3://models/tiny", DIGEST, good) is first
    source_check.fetch_manifest("s3://models/tiny", DIGEST, other)   # not taken from the first
    source_check.fetch_manifest("s3://models/tiny", DIGEST)           # nor anonymously
    assert reads == [good, other, None]
