"""The scrape configuration docs/metrics.md gives users of annotation discovery, read from
the page itself: the block the e2e test runs is the block users copy.

Debian's Prometheus (the one the tests run) is built without Kubernetes discovery, so
:func:`with_pod_discovery` swaps each ``kubernetes_sd_configs`` entry (role ``pod``) for an
``http_sd_configs`` entry that reads testkit.pod_discovery, which labels Pods the way
Kubernetes discovery does; everything else, the relabelling above all, stays as written.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
HEADING = "### A scrape configuration for annotation discovery"


def documented_scrape_configs() -> list[dict]:
    """The ``scrape_configs`` of the first YAML block under :data:`HEADING`."""
    section = DOCS.read_text().split(HEADING, 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, f"no yaml block under {HEADING!r} in {DOCS}"
    return yaml.safe_load(block.group(1))["scrape_configs"]


def with_pod_discovery(configs: list[dict], url: str, refresh: str = "1s") -> list[dict]:
    """The same jobs, each discovering Pods from the HTTP SD endpoint at ``url``."""
    configs = copy.deepcopy(configs)
    for job in configs:
        sds = job.pop("kubernetes_sd_configs")
        assert sds == [{"role": "pod"}], f"{job['job_name']}: the stand-in serves role pod only, not {sds}"
        job["http_sd_configs"] = [{"url": url, "refresh_interval": refresh}]
    return configs
