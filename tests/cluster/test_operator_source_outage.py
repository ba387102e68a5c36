"""Models that share a source that is down wait on one probe of it (issue 27, point 4).

Ten ResidentModels read their bundles from one real bundle server (the http layout), each
from its own path. The server is down: it answers 503 to everything, and counts every
request it gets. The operator runs in-process against the real API server, as the chart's
ServiceAccount. Once every model is ``Degraded`` ``SourceUnavailable``, the requests the
server gets in the next seconds are the probes of one loop (backoff 2, 4, 8, 16 s), not
one retry loop per model, and no model reads its manifest meanwhile. When the server
answers again, every model is woken, reads its manifest and is placed.
"""

from __future__ import annotations

import threading
import time

import pytest

from bundle.cpu_model import make_demo
from bundle.sources import push
from bundle.sources.httpserve import BundleRequestHandler, BundleServer
from resident_operator.metrics import REGISTRY

from conftest_operator import Api, condition, running_operator
from polling import wait_for

MODELS = 10
WINDOW_SECONDS = 12.0


class DownWhenAsked(BundleRequestHandler):
    """The real bundle server's handler, which answers 503 while ``server.down`` is set and
    records the path of every request it gets."""

    def do_GET(self) -> None:
        self._count_or_refuse() or super().do_GET()

    def do_HEAD(self) -> None:
        self._count_or_refuse() or super().do_HEAD()

    def _count_or_refuse(self) -> bool:
        with self.server.lock:
            self.server.requests.append((time.monotonic(), self.command, self.path))
        if self.server.down.is_set():
            self._reply(503, b"down for maintenance\n")
            return True
        return False


@pytest.fixture
def server(tmp_path):
    srv = BundleServer(tmp_path / "served", "127.0.0.1", 0, handler=DownWhenAsked)
    srv.down, srv.lock, srv.requests = threading.Event(), threading.Lock(), []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def requests_since(server, t: float) -> list[tuple[str, str]]:
    with server.lock:
        return [(method, path) for when, method, path in server.requests if when >= t]


def probes_made() -> float:
    return REGISTRY.get_sample_value("resident_operator_source_probes_total", {"result": "down"}) or 0.0


def test_models_on_one_source_that_is_down_share_one_probe_and_all_wake(cluster, namespace, server, tmp_path):
    digest = make_demo(tmp_path / "one", 256 * 1024, seed=21).digest
    sources = [f"{server.url}/models/m{i}" for i in range(MODELS)]   # one server, ten paths
    for source in sources:
        push(tmp_path / "one", source)
    server.down.set()
    api = Api(cluster, namespace)
    with running_operator(namespace):
        for i, source in enumerate(sources):
            api.create_model(f"m{i}", {"bundle": {"source": source, "digest": digest}})
        for i in range(MODELS):
            cond = wait_for(lambda: (c := condition(api.model(f"m{i}"), "Degraded")).get("reason")
                            == "SourceUnavailable" and c, timeout=30, what=f"m{i} Degraded/SourceUnavailable")
            assert "HTTP 503" in cond["message"], cond
        assert api.pods("resident.dev/model-uid") == []

        began, probed = time.monotonic(), probes_made()
        time.sleep(WINDOW_SECONDS)
        seen = requests_since(server, began)
        probes = [r for r in seen if r == ("GET", "/")]
        # one loop's probes in 12 s: at 2, 6, 14 s after the first failure (not 10 loops of them)
        assert 1 <= len(probes) <= 4, seen
        assert seen == probes, f"a model read its source while the probe was open: {seen}"
        assert probes_made() - probed == len(probes)

        server.down.clear()
        for i, source in enumerate(sources):
            m = wait_for(lambda: ((api.model(f"m{i}") or {}).get("status") or {}).get("bundle")
                         and api.model(f"m{i}"), timeout=60, what=f"m{i} placed once the source is back")
            assert m["status"]["bundle"] == {"source": source, "digest": digest}
            wait_for(lambda: api.pods(f"resident.dev/model=m{i}"), timeout=20, what=f"m{i}'s owner Pod")
            wait_for(lambda: condition(api.model(f"m{i}"), "Degraded").get("status") == "False",
                     timeout=20, what=f"m{i} Degraded=False")
