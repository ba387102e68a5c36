"""One probe per source: which sources are the same, the probe's backoff, sharing it, and
waking every waiter when it answers (the pure registry; the driver's probe loop too)."""

from __future__ import annotations

import asyncio
import time

import pytest

from bundle.errors import SourceUnavailable
from bundle.sources import is_outage
from bundle.sources.ranged import TransientUnavailable
from resident_operator.driver import probe_source
from resident_operator.retry_policy import source_backoff
from resident_operator.source_probes import SourceProbes, source_key


@pytest.mark.parametrize("uri,key", [
    ("http://Host.example/models/a", "http://host.example:80"),
    ("http://host.example:80/other", "http://host.example:80"),
    ("https://host.example/a", "https://host.example:443"),
    ("oci://registry.example:5000/repo:tag", "https://registry.example:5000"),
    ("oci+http://127.0.0.1:5000/repo", "http://127.0.0.1:5000"),
    ("http://[::1]:8080/x", "http://[::1]:8080"),
    ("file:///srv/bundles/a", None),
    ("http:///no-host", None),
    ("s3://bucket/key", "https://s3.us-east-1.amazonaws.com:443"),
    ("s3://bucket/key?region=eu-west-1&addressing=path", "https://s3.eu-west-1.amazonaws.com:443"),
    ("s3://bucket/key?endpoint=http://Minio.example:9000", "http://minio.example:9000"),
    ("s3://bucket/key?endpoint=https://minio.example", "https://minio.example:443"),
    ("hf://org/name@0123456789abcdef0123456789abcdef01234567", "https://huggingface.co:443"),
    ("hf://org/name@0123456789abcdef0123456789abcdef01234567?endpoint=http://127.0.0.1:8090", "http://127.0.0.1:8090"),
    ("hf://org", None),
    ("s3://Not_A_Bucket/key", None),
    ("http://host:notaport/", None),
])
def test_the_same_source_is_the_same_transport_host_and_port(uri, key):
    assert source_key(uri) == key


def test_one_layout_and_one_registry_on_one_server_share_a_probe():
    assert source_key("oci+http://h:5000/repo") == source_key("http://h:5000/layout")
    assert source_key("http://h:5000/a") != source_key("https://h:5000/a")


def test_buckets_on_one_s3_endpoint_share_its_probe_whatever_their_addressing():
    a = source_key("s3://models/a?endpoint=http://h:9000")
    assert a == source_key("s3://other-bucket/b?endpoint=http://h:9000&addressing=virtual") == "http://h:9000"
    assert a != source_key("s3://models/a?endpoint=http://h:9001")


def test_backoff_doubles_from_two_seconds_to_a_minute():
    assert [source_backoff(n) for n in range(8)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_the_first_model_opens_the_probe_and_the_others_join_it():
    probes = SourceProbes()
    opened = probes.wait("http://h:8000/models/a", "m1", "connection refused", now=100.0)
    assert opened is not None and opened.key == "http://h:8000" and opened.due == 102.0
    assert opened.url == "http://h:8000/"
    for i in range(2, 11):   # nine more models on the same server, other paths
        assert probes.wait(f"http://h:8000/models/{i}", f"m{i}", "refused", now=100.0 + i) is None
    assert len(probes.open_probes()) == 1
    assert probes.down("http://h:8000/models/zzz") == "connection refused"
    assert probes.down("http://other:8000/a") is None
    assert probes.down("file:///a") is None


def test_probes_back_off_while_down_and_every_waiter_wakes_on_the_answer():
    probes = SourceProbes()
    probes.wait("http://h/a", "m1", "refused", now=0.0)
    probes.wait("http://h/b", "m2", "refused", now=0.5)
    dues, now = [], 0.0
    for _ in range(6):
        now = probes.next_probe("http://h:80")
        dues.append(now)
        probes.failed("http://h:80", "HTTP 503", now)
    assert dues == [2.0, 6.0, 14.0, 30.0, 62.0, 122.0]   # 2, 4, 8, 16, 32, 60 s apart
    assert probes.down("http://h/a") == "HTTP 503"
    assert probes.answered("http://h:80", now=200.0) == {"m1", "m2"}
    assert probes.next_probe("http://h:80") is None and probes.down("http://h/a") is None
    assert probes.answered("http://h:80", now=201.0) == set()   # answered once only


def test_a_relapse_resumes_the_backoff_and_a_later_failure_starts_over():
    probes = SourceProbes()
    probes.wait("http://h/a", "m1", "refused", now=0.0)
    for now in (2.0, 6.0, 14.0):
        probes.failed("http://h:80", "HTTP 503", now)
    probes.answered("http://h:80", now=30.0)
    relapse = probes.wait("http://h/a", "m1", "HTTP 503", now=31.0)   # reads fail again at once
    assert relapse is not None and relapse.due == 31.0 + 32.0
    probes.answered("http://h:80", now=63.0)
    later = probes.wait("http://h/a", "m1", "refused", now=63.0 + 61)  # a new outage, much later
    assert later is not None and later.due == 63.0 + 61 + 2.0


def test_a_probe_nobody_waits_on_closes():
    probes = SourceProbes()
    probes.wait("http://h/a", "m1", "refused", now=0.0)
    probes.wait("http://h/b", "m2", "refused", now=0.0)
    probes.wait("http://g/b", "m2", "refused", now=0.0)
    assert [p.key for p in probes.leave("m2")] == ["http://g:80"]
    assert [p.key for p in probes.leave("m1")] == ["http://h:80"]
    assert probes.open_probes() == []


def test_an_outage_is_a_failure_to_answer_not_an_answer():
    refused = SourceUnavailable("http://h/m: connection refused (gave up after 2 attempts)")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert is_outage(refused)
    assert is_outage(TransientUnavailable("GET http://h/v2/: HTTP 503"))
    assert not is_outage(SourceUnavailable("http://h/m: not found (HTTP 404)"))
    assert not is_outage(FileNotFoundError("/srv/a"))


class Waiter:
    def __init__(self) -> None:
        self.pokes: list[str] = []

    def poke(self, cause: str) -> None:
        self.pokes.append(cause)


class Answers:
    """A stand-in for aiohttp's session: the statuses the probe gets, in order."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.urls = list(statuses), []

    def get(self, url: str, **_):
        self.urls.append(url)
        status = self.statuses.pop(0)

        class Response:
            async def __aenter__(self):
                return type("R", (), {"status": status})()

            async def __aexit__(self, *exc):
                return False
        return Response()


def test_the_probe_loop_probes_one_url_until_it_answers_then_wakes_all(monkeypatch):
    probes, waiters = SourceProbes(), [Waiter() for _ in range(10)]
    monkeypatch.setattr("resident_operator.retry_policy.SOURCE_FIRST_SECONDS", 0.01)
    for i, w in enumerate(waiters):
        opened = probes.wait(f"http://h:9/m/{i}", w, "refused", now=time.monotonic())
        if i == 0:
            key = opened.key
    answers = Answers([503, 503, 404])     # down, down, then an answer (404 is an answer)
    asyncio.run(probe_source(probes, key, answers))
    assert answers.urls == ["http://h:9/"] * 3
    assert all(w.pokes == ["source"] for w in waiters)
    assert probes.open_probes() == []


def test_a_probe_that_fails_wakes_its_models_to_read_the_source_again(monkeypatch):
    """Models on a probe have no safety resync: a probe that dies must not leave them asleep."""
    probes, waiters = SourceProbes(), [Waiter() for _ in range(3)]
    for w in waiters:
        opened = probes.wait("http://h:9/m", w, "refused", now=time.monotonic()) or opened

    async def broken(*_):
        raise RuntimeError("a bug in the probe")
    monkeypatch.setattr("resident_operator.driver._probe_until_answered", broken)
    asyncio.run(probe_source(probes, opened.key, None))
    assert all(w.pokes == ["source"] for w in waiters)
    assert probes.open_probes() == []
