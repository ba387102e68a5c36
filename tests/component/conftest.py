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

