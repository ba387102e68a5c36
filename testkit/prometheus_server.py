"""A real Prometheus server for tests: Debian's ``prometheus`` on 127.0.0.1, stopped by PID.

:func:`running_prometheus` writes the configuration it is given (and the rule files it
names) into a directory of its own, starts ``/usr/bin/prometheus`` (the ``prometheus``
package that scripts/bootstrap installs) with its TSDB there, listening only on
``127.0.0.1`` at a free port, and yields a :class:`Prometheus` once ``/-/ready`` answers.
A system instance the package may have started is never used: this one has its own port,
configuration and data. On exit the process gets SIGTERM (then SIGKILL), and its data
goes with the directory.

:class:`Prometheus` is the test's view of it through the HTTP API: instant queries, the
active alerts, the scrape targets.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from localcluster.processes import ProcessGroup, free_port

BINARY = "/usr/bin/prometheus"


def prometheus_binary() -> str:
    found = BINARY if Path(BINARY).exists() else shutil.which("prometheus")
    if not found:
        raise RuntimeError("Prometheus is not installed: apt-get install prometheus "
                           "(scripts/bootstrap installs it)")
    return found


@dataclass
class Prometheus:
    url: str

    def _get(self, path: str, **params) -> dict:
        answer = requests.get(self.url + path, params=params, timeout=10)
        body = answer.json()
        if answer.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"GET {path} {params}: {answer.status_code} {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """The instant vector ``expr`` evaluates to now: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr} is a {data['resultType']}, not a vector")
        return data["result"]

    def alerts(self, state: str | None = None) -> list[dict]:
        """Active alerts (pending and firing), or those in ``state``."""
        found = self._get("/api/v1/alerts")["alerts"]
        return [a for a in found if state in (None, a["state"])]

    def targets(self) -> list[dict]:
        """Active scrape targets, each with its ``labels``, ``health`` and ``lastError``."""
        return self._get("/api/v1/targets", state="active")["activeTargets"]


@contextlib.contextmanager
def running_prometheus(work: Path, config: dict, timeout: float = 30.0):
    """Prometheus on 127.0.0.1 with ``config`` (a prometheus.yml as a dict; rule files it
    names must exist); yields a :class:`Prometheus` once it is ready."""
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    argv = [prometheus_binary(), f"--config.file={config_file}",
            f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d"]
    group = ProcessGroup(work / "logs")
    url = f"http://127.0.0.1:{port}"
    try:
        group.start("prometheus", argv)
        group.await_http(url + "/-/ready", "Prometheus", timeout, ready=lambda answer: answer.status_code == 200)
        yield Prometheus(url)
    finally:
        group.stop(timeout=5.0)
