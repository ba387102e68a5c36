"""The inference port through real HTTP on 127.0.0.1: the official ``openai`` client,
revision headers, traffic during in-place and reload transitions, API key, bad requests
and per-revision metrics.

SlowCpuBackend is a test-only subclass of the real cpu backend that makes in-place row
writes, streamed tokens and reloads take a set time, so requests can be aimed at the
middle of a transition.
"""

import json
import socket
import threading
import time
from contextlib import contextmanager

import openai
import pytest
import requests

from bundle.cpu_model import WORDS, Tokenizer, make_demo, make_revision
from owner.backends.cpu import CpuBackend
from owner.inference import make_inference_server
from testkit.local_volume import stage_revision
from owner.revisions import open_revision
from owner.runtime import DRAIN_QUIET_SECONDS, QUIET_CEILING_SECONDS, Owner
from owner.server import make_server

TOKEN = "control-t0ken"
KEY = "inference-k3y"
SIZE = 512 * 1024
PROMPT = "Which revision are you?"


class SlowCpuBackend(CpuBackend):
    """Test-only: an in-place update's first row write takes ``write`` s, each streamed
    token ``token`` s, a reload ``load`` s more; events say when a write or a reload began."""

    def __init__(self, write=0.0, token=0.0, load=0.0):
        super().__init__()
        self.write, self.token, self.load_delay = write, token, load
        self.writing, self.reloading = threading.Event(), threading.Event()

    def write_rows(self, name, rows, values):
        if not self.writing.is_set():
            self.writing.set()
            time.sleep(self.write)
        super().write_rows(name, rows, values)

    def generate_stream(self, prompt, max_tokens):
        for piece in super().generate_stream(prompt, max_tokens):
            time.sleep(self.token)
            yield piece

    def reload(self, revision):
        self.reloading.set()
        time.sleep(self.load_delay)
        return super().reload(revision)


@pytest.fixture(scope="module")
def volume(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inference")
    src, vol = tmp / "src", tmp / "vol"
    digests = {"base": make_demo(src / "base", SIZE, seed=11, chunk_size=64 * 1024).digest}
    stage_revision(vol, src / "base", make_current=True, hardlink=False)
    make_revision(src / "base", src / "rows", "rows", seed=12, fraction=0.2, chunk_size=64 * 1024)
    make_revision(src / "base", src / "whole", "whole", chunk_size=64 * 1024)
    for name in ("rows", "whole"):
        digests[name] = stage_revision(vol, src / name, hardlink=False)
    return vol, digests


@pytest.fixture(scope="module")
def reference(volume):
    """The text a fresh load of each revision generates for PROMPT (8 tokens)."""
    vol, digests = volume
    out = {}
    for digest in digests.values():
        b = CpuBackend()
        b.load(open_revision(vol, digest))
        out[digest] = b.generate(PROMPT, 8).text
    return out


class Owners:
    def __init__(self, owner, control, inference):
        self.owner, self.control, self.url = owner, control, inference

    def transition(self, target, strategy="Auto", drain=0.0, leave_endpoints=True):
        r = requests.post(self.control + "/v1/transitions", timeout=10,
                          json={"target": target, "path": "WholeBundle", "strategy": strategy,
                                "drainSeconds": drain, "leaveEndpoints": leave_endpoints},
                          headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 202, r.text
        return r.json()["id"]

    def finished(self, tid):
        r = requests.get(f"{self.control}/v1/transitions/{tid}?waitSeconds=30", timeout=40,
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.json()["result"] != "running"
        return r.json()

    def complete(self, body=None, key=None, **kw):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return requests.post(self.url + "/v1/completions", json=body or {"model": "model", "prompt": PROMPT,
                                                                         "max_tokens": 8},
                             headers=headers, timeout=30, **kw)

    def ready(self):
        return requests.get(self.url + "/readyz", timeout=5).status_code


@contextmanager
def serving(vol, backend=None, api_key=None, apply_wait=30.0):
    owner = Owner(vol, backend or CpuBackend(), apply_wait_seconds=apply_wait)
    owner.start()
    servers = [make_server(owner, TOKEN, "127.0.0.1", 0),
               make_inference_server(owner, "127.0.0.1", 0, "model", api_key)]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield Owners(owner, *(f"http://127.0.0.1:{s.server_address[1]}" for s in servers))
    finally:
        for s, t in zip(servers, threads):
            s.shutdown()
            s.server_close()
            t.join(10)
        owner.close()


def sse_events(response):
    """The JSON documents of a server-sent event stream, up to and without [DONE]."""
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith(b"data: "), line
        if line == b"data: [DONE]":
            return events
        events.append(json.loads(line[6:]))
    raise AssertionError("the stream ended without [DONE]")


def test_openai_client_completes_plain_and_streamed_and_lists_the_model(volume, reference):
    vol, d = volume
    with serving(vol) as o:
        client = openai.OpenAI(base_url=o.url + "/v1", api_key="not-checked", max_retries=0)
        raw = client.completions.with_raw_response.create(model="model", prompt=PROMPT, max_tokens=8)
        done = raw.parse()
        assert raw.headers["Resident-Revision"] == d["base"] == done.system_fingerprint
        assert done.choices[0].text == reference[d["base"]] and done.choices[0].finish_reason == "length"
        assert (done.model, done.usage.completion_tokens, done.usage.prompt_tokens) == \
            ("model", 8, len(Tokenizer(WORDS).encode(PROMPT)))
        assert set(done.choices[0].text.split()) <= set(WORDS)   # the demo's tokens print as words

        chunks = list(client.completions.create(model="model", prompt=PROMPT, max_tokens=8, stream=True,
                                                temperature=0.7, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == reference[d["base"]]
        assert len([c for c in chunks if c.choices and not c.choices[0].finish_reason]) == 8  # one per token
        assert {c.system_fingerprint for c in chunks} == {d["base"]}
        assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 8

        models = client.models.list().data
        assert [(m.id, m.revision) for m in models] == [("model", d["base"])]
        assert client.models.retrieve("model").revision == d["base"]
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("other")


def test_a_streamed_completion_joins_to_the_whole_text(volume):
    vol, _ = volume
    with serving(vol) as o:
        body = {"prompt": "Grüße, 世界", "max_tokens": 24}
        whole = o.complete(body).json()["choices"][0]["text"]
        with o.complete({**body, "stream": True}, stream=True) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            streamed = "".join(e["choices"][0]["text"] for e in sse_events(r))
        assert streamed == whole


def test_request_during_in_place_apply_waits_and_one_revision_answers_it_wholly(volume, reference):
    vol, d = volume
    backend = SlowCpuBackend(write=0.5, token=0.05)
    with serving(vol, backend) as o:
        ready_codes, stop = set(), threading.Event()

        def probe():
            while not stop.is_set():
                ready_codes.add(o.ready())
                time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        # a stream that began on base holds it: the apply waits until it ends
        with o.complete({"prompt": PROMPT, "max_tokens": 8, "stream": True}, stream=True) as early:
            lines = early.iter_lines()
            first = next(line for line in lines if line)
            tid = o.transition(d["rows"], strategy="InPlace")
            time.sleep(0.2)
            assert not backend.writing.is_set()  # the apply waits for the request in flight
            rest = [json.loads(line[6:]) for line in lines if line and line != b"data: [DONE]"]
        events = [json.loads(first[6:])] + rest
        assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == reference[d["base"]]
        assert {e["system_fingerprint"] for e in events} == {d["base"]} == {early.headers["Resident-Revision"]}

        assert backend.writing.wait(10)
        late = o.complete()                        # arrives during the apply: waits, then the new revision
        assert o.finished(tid)["result"] == "succeeded"
        stop.set()
        prober.join()
        body = late.json()
        assert late.status_code == 200
        assert late.headers["Resident-Revision"] == body["system_fingerprint"] == d["rows"]
        assert body["choices"][0]["text"] == reference[d["rows"]]
        assert ready_codes == {200}                # ready throughout the in-place transition
        assert o.owner.state == "ready"


def test_request_waiting_longer_than_the_apply_wait_gets_503(volume):
    vol, d = volume
    backend = SlowCpuBackend(write=0.5)
    with serving(vol, backend, apply_wait=0.05) as o:
        tid = o.transition(d["rows"], strategy="InPlace")
        assert backend.writing.wait(10)
        r = o.complete()
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "service_unavailable" and "waited" in r.json()["error"]["message"]
        assert o.finished(tid)["result"] == "succeeded"
        assert o.complete().json()["system_fingerprint"] == d["rows"]


def test_a_request_sent_to_a_drained_owner_while_it_reloads_waits_for_the_new_revision(volume, reference):
    """A replica that left its Service's endpoints reloads; a proxy whose watch lags (after
    an API server restart: the chaos soak's fourth and sixth hours each got one 503 so)
    still sends a request. It waits for the load and the new revision answers it."""
    vol, d = volume
    backend = SlowCpuBackend(load=0.8)
    with serving(vol, backend) as o:
        with requests.Session() as s:  # one kept-alive connection across the reload: never reset
            assert s.post(o.url + "/v1/completions", json={"prompt": PROMPT}, timeout=10).status_code == 200
            tid = o.transition(d["whole"], strategy="Reload")
            assert backend.reloading.wait(10)
            assert o.ready() == 503                    # out of the endpoints while it loads
            t0 = time.monotonic()
            r = s.post(o.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8}, timeout=10)
            assert r.status_code == 200, r.text
            assert time.monotonic() - t0 > 0.2          # it waited for the load
            assert r.headers["Resident-Revision"] == d["whole"]
            assert r.json()["choices"][0]["text"] == reference[d["whole"]]
            assert o.finished(tid)["result"] == "succeeded"
            assert o.ready() == 200


def test_the_only_replica_stays_ready_through_its_reload_and_answers_503_with_retry_after(volume, reference):
    """``leaveEndpoints: false``: a Service with no other endpoint keeps sending to the owner,
    whose clients get its 503 with Retry-After instead of a connection the Service refuses."""
    vol, d = volume
    backend = SlowCpuBackend(load=0.8)
    with serving(vol, backend) as o:
        tid = o.transition(d["whole"], strategy="Reload", leave_endpoints=False)
        assert backend.reloading.wait(10)
        r = o.complete()
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert o.ready() == 200
        assert o.finished(tid)["result"] == "succeeded"
        assert o.ready() == 200 and o.complete().headers["Resident-Revision"] == d["whole"]


def test_reload_drain_turns_not_ready_while_the_old_revision_still_serves(volume, reference):
    vol, d = volume
    with serving(vol) as o:
        tid = o.transition(d["whole"], strategy="Reload", drain=1.5)
        deadline = time.monotonic() + 5
        while o.ready() != 503:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = o.complete()                            # not ready, but still answering from base
        assert r.status_code == 200 and r.headers["Resident-Revision"] == d["base"]
        assert r.json()["choices"][0]["text"] == reference[d["base"]]
        while (st := requests.get(f"{o.control}/v1/transitions/{tid}", timeout=10,   # as the operator polls
                                  headers={"Authorization": f"Bearer {TOKEN}"}).json())["result"] == "running":
            time.sleep(0.1)   # the control port's calls are no clients: they do not hold the drain open
        assert st["result"] == "succeeded" and 1.5 <= st["timings"]["totalSeconds"] < 1.5 + QUIET_CEILING_SECONDS + 5
        assert o.ready() == 200 and o.complete().headers["Resident-Revision"] == d["whole"]


def test_a_reload_drains_until_no_client_is_sent_here_any_more(volume, reference):
    """Leaving the Service can take longer than ``drainSeconds`` (an API server restarting,
    a kubelet killed: the chaos soak saw both): while requests still come, the old revision
    answers them, and the reload begins only after a quiet second."""
    vol, d = volume
    with serving(vol) as o:
        tid = o.transition(d["whole"], strategy="Reload", drain=0.3)
        answers, t0 = [], time.monotonic()
        with requests.Session() as s:
            while time.monotonic() - t0 < 2.5:   # a proxy that has not heard yet
                last = time.monotonic()
                r = s.post(o.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8}, timeout=10)
                answers.append((r.status_code, r.headers.get("Resident-Revision")))
                time.sleep(0.05)
        assert set(answers) == {(200, d["base"])}, set(answers)
        st = o.finished(tid)
        assert st["result"] == "succeeded" and st["timings"]["totalSeconds"] >= last - t0 + DRAIN_QUIET_SECONDS
        assert o.complete().headers["Resident-Revision"] == d["whole"]


def test_a_reload_drain_is_not_fooled_by_sparse_traffic_from_a_proxy_that_still_sends_here(volume):
    """With several replicas a proxy that has not heard of the drain picks this Pod only
    now and then: gaps of a second and more between its requests are usual (the chaos soak's
    hour got 503s from reloads begun in such a gap). The drain waits out several usual gaps,
    so a 1.6 s gap in traffic that came every 0.4 s does not end it."""
    vol, d = volume
    with serving(vol) as o, requests.Session() as s:
        def ask():
            r = s.post(o.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, timeout=10)
            return r.status_code, r.headers.get("Resident-Revision")
        answers = []
        for _ in range(8):                 # the traffic this owner is used to: one every 0.4 s
            answers.append(ask())
            time.sleep(0.4)
        tid = o.transition(d["whole"], strategy="Reload", drain=0.3)
        for gap in (0.4, 0.4, 1.6, 0.4, 0.4):   # still sent here, with one longer gap
            time.sleep(gap)
            answers.append(ask())
        assert set(answers) == {(200, d["base"])}, answers
        assert o.finished(tid)["result"] == "succeeded"
        assert ask() == (200, d["whole"])


def test_drain_seconds_out_of_range_is_refused(volume):
    vol, d = volume
    with serving(vol) as o:
        r = requests.post(o.control + "/v1/transitions", timeout=10, headers={"Authorization": f"Bearer {TOKEN}"},
                          json={"target": d["whole"], "path": "WholeBundle", "drainSeconds": 121})
        assert r.status_code == 400 and "drainSeconds" in r.json()["error"]


def test_api_key_is_enforced_when_set(volume):
    vol, d = volume
    with serving(vol, api_key=KEY) as o:
        for key in (None, "wrong"):
            r = o.complete(key=key)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert requests.get(o.url + "/v1/models", timeout=5,
                                headers={"Authorization": f"Bearer {key}"} if key else {}).status_code == 401
        assert o.complete(key=KEY).status_code == 200
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert requests.get(o.url + probe, timeout=5).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=o.url + "/v1", api_key="wrong", max_retries=0).completions.create(
                model="model", prompt=PROMPT, max_tokens=2)
        good = openai.OpenAI(base_url=o.url + "/v1", api_key=KEY, max_retries=0)
        assert good.completions.create(model="model", prompt=PROMPT, max_tokens=2).system_fingerprint == d["base"]


def test_bad_requests_get_openai_style_errors_on_a_kept_alive_connection(volume):
    vol, _ = volume
    cases = [  # body, status, param, code
        ({"model": "model"}, 400, "prompt", None),
        ({"prompt": ""}, 400, "prompt", None),
        ({"prompt": ["a", "b"]}, 400, "prompt", None),
        ({"prompt": PROMPT, "max_tokens": 1025}, 400, "max_tokens", None),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens", None),
        ({"prompt": PROMPT, "n": 2}, 400, "n", None),
        ({"prompt": PROMPT, "stop": ["\n"]}, 400, "stop", None),
        ({"prompt": PROMPT, "frobnicate": 1}, 400, "frobnicate", None),
        ({"prompt": "x " * 1000, "max_tokens": 100}, 400, "prompt", None),  # longer than any variant
        ({"model": "gpt-4", "prompt": PROMPT}, 404, "model", "model_not_found"),
    ]
    with serving(vol) as o, requests.Session() as s:
        for body, status, param, code in cases:
            r = s.post(o.url + "/v1/completions", json=body, timeout=10)
            err = r.json()["error"]
            assert (r.status_code, err["param"], err["code"]) == (status, param, code), (body, r.text)
            assert err["type"] == "invalid_request_error" and err["message"]
        r = s.post(o.url + "/v1/completions", data=b"{not json", timeout=10,
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = s.get(o.url + "/v1/chat/nothing", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
        assert s.post(o.url + "/v1/completions", json={"prompt": PROMPT}, timeout=10).status_code == 200


def test_a_client_that_leaves_mid_stream_releases_the_revision(volume):
    vol, d = volume
    backend = SlowCpuBackend(token=0.05)
    with serving(vol, backend) as o:
        body = json.dumps({"prompt": PROMPT, "max_tokens": 40, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", int(o.url.rsplit(":", 1)[1])), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            seen = b""
            while b"data: " not in seen:     # the headers may come in a packet of their own
                got = sock.recv(4096)
                assert got, f"the stream ended before its first chunk: {seen!r}"
                seen += got
            # the first chunk came; the client goes away
        tid = o.transition(d["rows"], strategy="InPlace")
        st = o.finished(tid)
        assert st["result"] == "succeeded" and st["timings"]["totalSeconds"] < 5
        o.transition(d["base"], strategy="InPlace")


def test_metrics_count_requests_and_tokens_by_revision_and_latency_of_all(volume):
    vol, d = volume
    with serving(vol, SlowCpuBackend(load=0.5)) as o:
        for _ in range(2):
            assert o.complete().status_code == 200
        assert o.complete({"prompt": PROMPT, "model": "nope"}).status_code == 404
        tid = o.transition(d["whole"], strategy="Reload", leave_endpoints=False)   # the only replica
        o.owner.backend.reloading.wait(10)
        assert o.complete().status_code == 503
        o.finished(tid)
        assert o.complete().status_code == 200
        text = requests.get(o.url + "/metrics", timeout=5).text
        base, whole = d["base"], d["whole"]
        for line in (f'resident_owner_inference_requests_total{{code="200",revision="{base}"}} 2.0',
                     f'resident_owner_inference_requests_total{{code="200",revision="{whole}"}} 1.0',
                     'resident_owner_inference_requests_total{code="503",revision="none"} 1.0',
                     'resident_owner_inference_requests_total{code="404",revision="none"} 1.0',
                     'resident_owner_inference_errors_total{revision="none",type="service_unavailable"} 1.0',
                     f'resident_owner_generated_tokens_total{{revision="{base}"}} 16.0',
                     f'resident_owner_generated_tokens_total{{revision="{whole}"}} 8.0',
                     'resident_owner_time_to_first_token_seconds_count 3.0',
                     'resident_owner_inference_request_duration_seconds_count 5.0',
                     'resident_owner_ready 1.0'):
            assert line in text, line


class GenerateOnlyCpuBackend(CpuBackend):
    """Test-only: a backend that cannot stream (as a backend offering only ``generate``)."""
    generate_stream = None


def test_a_backend_without_streaming_still_answers_streams_in_one_piece(volume, reference):
    vol, d = volume
    with serving(vol, GenerateOnlyCpuBackend()) as o:
        with o.complete({"prompt": PROMPT, "max_tokens": 8, "stream": True}, stream=True) as r:
            events = sse_events(r)
        assert [e["choices"][0]["text"] for e in events] == [reference[d["base"]], ""]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert o.complete().json()["choices"][0]["text"] == reference[d["base"]]
