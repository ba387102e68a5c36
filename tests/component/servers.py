"""Real servers the component tests start on 127.0.0.1 and stop by PID: Debian's
docker-registry, and a wait until a freshly started server answers (the S3 server is
``testkit.s3_server``, shared with the cluster tests)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import requests

from localcluster.binaries import apt_install
from localcluster.processes import ProcessGroup, free_port

REGISTRY_BIN = "/usr/bin/docker-registry"


def wait_for(url: str, group: ProcessGroup, what: str, timeout: float = 20.0) -> None:
    """Until ``url`` answers at all; fail early if a process of ``group`` exited."""
    deadline = time.monotonic() + timeout
    while True:
        group.check_alive()
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} in {timeout:.0f} s")
        time.sleep(0.05)


@contextlib.contextmanager
def running_registry(work: Path, auth_yaml: str = ""):
    """A real docker-registry (distribution v2) on a free loopback port; stopped by PID after.

    Yields ("127.0.0.1:PORT", storage root). ``auth_yaml`` is the config's ``auth:`` section.
    """
    if not os.path.exists(REGISTRY_BIN):
        apt_install(("docker-registry",))
    port = free_port()
    config = work / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {work / 'data'}
http:
  addr: 127.0.0.1:{port}
{auth_yaml}""")
    group = ProcessGroup(work / "logs")
    try:
        group.start("docker-registry", [REGISTRY_BIN, "serve", str(config)])
        wait_for(f"http://127.0.0.1:{port}/v2/", group, "docker-registry")
        yield f"127.0.0.1:{port}", work / "data"
    finally:
        group.stop()

