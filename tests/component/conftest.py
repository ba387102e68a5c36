"""Fixtures shared by the component tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from csi_bridge import mountinfo
from testkit.bridge import cleanup_mounts


@pytest.fixture
def short_tmp():
    """A short directory under /tmp (unix socket paths are limited to 107 bytes), unmounted
    and removed afterwards, never through a mount."""
    path = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    try:
        yield path
    finally:
        cleanup_mounts(path)
        assert mountinfo.mounts_under(path) == []
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """One real S3-compatible server (SeaweedFS) for the whole session: ``http://127.0.0.1:PORT``.
    Tests make buckets of their own (:func:`s3_bucket`)."""
    from testkit.s3_server import running_s3
    with running_s3(tmp_path_factory.mktemp("s3")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3_bucket(s3_endpoint):
    """The session's bucket on that server (SeaweedFS gives every bucket volumes of its own,
    so tests share one and keep apart by key prefix: :func:`s3_prefix`)."""
    from testkit.s3_server import admin_client, make_bucket
    make_bucket(admin_client(s3_endpoint), "resident-tests")
    return "resident-tests"


@pytest.fixture
def s3_prefix(request):
    """A key prefix of this test's own: ``<test name>-<random>``."""
    import re
    import uuid
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:60].strip("-")
    return f"{name}-{uuid.uuid4().hex[:8]}"
