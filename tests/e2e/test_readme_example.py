"""The README's first model, as written, on the local node with Resident installed by its
chart (the shared ``world``): start ``resident bundle serve-demo``, then
``kubectl apply -f examples/residentmodel.yaml``; it must reach Ready and answer."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster.scenario import Story

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "residentmodel.yaml"


def test_the_readme_example_is_ready_on_a_fresh_install(world):
    cluster = world.cluster
    serve = subprocess.Popen([str(Path(sys.executable).parent / "resident"), "bundle", "serve-demo"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        printed = ""
        for line in serve.stdout:                    # the ResidentModel, then a blank line
            if not line.strip():
                break
            printed += line
        assert printed == EXAMPLE.read_text()
        cluster.wait_for_service_account("default")
        cluster.kubectl("apply", "-f", str(EXAMPLE))
        story = Story(cluster, "default", "tiny-lm", world.installation.bridge_root)
        digest = story.get()["spec"]["bundle"]["digest"]
        story.wait_ready(digest, timeout=180)
        row = cluster.kubectl("get", "residentmodels", "--no-headers").stdout.split()
        assert row[:2] == ["tiny-lm", "Ready"] and row[3] == "1/1", (row, story.probe_failures())
        story.wait_routed()   # kube-proxy programs the Service a moment after Ready (README)
        _, answer = story.complete("Resident keeps", max_tokens=4)     # the README's next step
        assert answer["system_fingerprint"] == digest
        story.delete_and_wait_gone()
        deadline = time.monotonic() + 60
        while any(story.leftovers()[k] for k in ("pods", "bundleDeliveries", "services")):
            assert time.monotonic() < deadline, story.leftovers()
            time.sleep(1)
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
