"""``resident bundle serve-demo`` as a user runs it: a real process, real HTTP on 127.0.0.1.

It must print exactly the README's ``examples/residentmodel.yaml`` (only the port differs
when it is not the default), serve that digest at that source, and leave nothing behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from bundle.demo_server import PORT
from bundle.sources import fetch_verified, open_source

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "residentmodel.yaml"


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys, resident_cli; sys.exit(resident_cli.main())",
                             "bundle", "serve-demo", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_model(proc: subprocess.Popen) -> tuple[str, str]:
    """The YAML printed on stdout (up to its blank line) and the stderr line naming the work dir."""
    lines = []
    for line in proc.stdout:
        if not line.strip():
            break
        lines.append(line)
    return "".join(lines), proc.stderr.readline()


def test_prints_the_readme_example_and_serves_its_digest():
    proc = start()
    try:
        text, served = read_model(proc)
        # the source is named as the local cluster reaches this machine's loopback
        port = int(re.search(r"10\.200\.0\.1:(\d+)/", text).group(1))
        assert text.replace(f"10.200.0.1:{port}/", f"10.200.0.1:{PORT}/") == EXAMPLE.read_text()
        model = yaml.safe_load(text)
        source, digest = model["spec"]["bundle"]["source"], model["spec"]["bundle"]["digest"]
        source = source.replace("10.200.0.1", "127.0.0.1")     # where it listens, here
        with open_source(source) as src:
            manifest = src.fetch_manifest(digest)
            weights = manifest.by_path()["model.safetensors"]
            body = fetch_verified(src, weights, 0, weights.size, weights.sha256)
            assert len(body) == weights.size > 3 * 2**20
        work = Path(re.search(r" from (\S+);", served).group(1))
        assert work.is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    assert not work.exists()            # the temporary directory is removed on exit


def test_a_wildcard_address_needs_the_url_the_cluster_uses(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import sys, resident_cli; sys.exit(resident_cli.main())",
                           "bundle", "serve-demo", "--host", "0.0.0.0", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "give --url" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_busy_port_is_a_clear_error_and_leaves_nothing(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-c", "import sys, resident_cli; sys.exit(resident_cli.main())",
                               "bundle", "serve-demo", "--port", str(port)], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 1 and "Address already in use" in proc.stderr
    assert list(tmp_path.iterdir()) == []          # its temporary directory is gone too
