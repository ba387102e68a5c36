"""The README's image recipe, as written: build the project image as an OCI archive, push
it with skopeo into a real docker-registry on 127.0.0.1, pull it back and check it is the
image the chart expects and the local cluster runs.

The commands come from the README's "Install on a cluster" block; only the placeholders
change (``dist/images`` becomes a temporary directory, ``REGISTRY`` the local registry)
and skopeo gets ``--dest-tls-verify=false`` because this registry speaks plain HTTP."""

from __future__ import annotations

import hashlib
import io
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import requests
import yaml

from localcluster.binaries import apt_install
from localcluster.images import project_image
from localcluster.oci_layout import MANIFEST_MEDIA_TYPE, image_manifest

from servers import running_registry

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
OUT_PLACEHOLDER, REGISTRY_PLACEHOLDER = "dist/images", "REGISTRY"


def install_commands() -> list[list[str]]:
    """The shell commands of the README's install block, as argv lists (comments dropped)."""
    section = README.read_text().split("## Install on a cluster", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def the_command(commands: list[list[str]], program: str) -> list[str]:
    found = [argv for argv in commands if argv[0].endswith(program)]
    assert len(found) == 1, f"the README's install block should run {program} once: {commands}"
    return found[0]


def values_path_exists(values: dict, dotted: str) -> bool:
    node = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg[0]


@pytest.fixture(scope="module")
def skopeo():
    apt_install(("skopeo",))
    return shutil.which("skopeo")


def test_the_readme_image_recipe_pushes_the_image_the_chart_and_the_cluster_run(registry, skopeo, tmp_path):
    commands = install_commands()
    build, copy, helm = (the_command(commands, p) for p in ("scripts/images", "skopeo", "helm"))
    # the README's output directory is git-ignored, so a build never puts its own archive
    # into the next image's source tree (the tree digest would change every time)
    assert OUT_PLACEHOLDER in build
    assert subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", f"{OUT_PLACEHOLDER}/resident.tar"]).returncode == 0

    out = tmp_path / "images"
    built = subprocess.run([a.replace(OUT_PLACEHOLDER, str(out)) for a in build], cwd=REPO,
                           capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stderr[-3000:]
    archive = out / "resident.tar"
    local = image_manifest(archive)
    assert local.digest == image_manifest(project_image()[1]).digest   # what localcluster.install imports

    push = [a.replace(OUT_PLACEHOLDER, str(out)).replace(REGISTRY_PLACEHOLDER, registry) for a in copy]
    assert push[:2] == ["skopeo", "copy"]
    destination = push[-1]
    assert destination.startswith(f"docker://{registry}/")
    pushed = subprocess.run([skopeo, "copy", "--dest-tls-verify=false", *push[2:]],
                            capture_output=True, text=True, timeout=300)
    assert pushed.returncode == 0, pushed.stderr

    # -- pulled back from the registry: the archive's manifest, config and layers ------------
    repository, tag = destination.removeprefix(f"docker://{registry}/").rsplit(":", 1)
    base = f"http://{registry}/v2/{repository}"
    answer = requests.get(f"{base}/manifests/{tag}", headers={"Accept": MANIFEST_MEDIA_TYPE}, timeout=10)
    answer.raise_for_status()
    assert answer.headers["Docker-Content-Digest"] == local.digest
    assert f"sha256:{hashlib.sha256(answer.content).hexdigest()}" == local.digest
    manifest = answer.json()
    assert manifest["mediaType"] == MANIFEST_MEDIA_TYPE
    assert [(x["digest"], x["size"]) for x in manifest["layers"]] == [
        (x["digest"], x["size"]) for x in local.manifest["layers"]]
    for layer in manifest["layers"]:
        head = requests.head(f"{base}/blobs/{layer['digest']}", timeout=10)
        assert head.status_code == 200 and int(head.headers["Content-Length"]) == layer["size"]
    config = requests.get(f"{base}/blobs/{manifest['config']['digest']}", timeout=10).json()
    assert config == local.config

    # -- the image runs `resident` as the chart's non-root user ------------------------------
    values = yaml.safe_load((REPO / "charts/resident/values.yaml").read_text())
    container = config["config"]
    assert container["Entrypoint"] == ["resident"]       # the operator container passes only args
    operator = values["operator"]
    assert container["User"] == f"{operator['runAsUser']}:{operator['runAsGroup']}" and operator["runAsUser"] != 0
    path = next(e.split("=", 1)[1] for e in container["Env"] if e.startswith("PATH="))
    app = requests.get(f"{base}/blobs/{manifest['layers'][-1]['digest']}", timeout=30).content
    with tarfile.open(fileobj=io.BytesIO(app), mode="r:gz") as tar:
        members = set(tar.getnames())
    # the bridge and the owners name `resident` as their command, found on this PATH
    assert any(f"{d.lstrip('/')}/resident" in members for d in path.split(":")), (path, sorted(members)[:20])

    # -- the helm command names what was pushed, through values the chart has ----------------
    sets = dict(helm[i + 1].split("=", 1) for i, a in enumerate(helm) if a == "--set")
    assert all(values_path_exists(values, key) for key in sets), sets
    assert values["operator"]["owner"]["image"]["repository"] == ""   # owners run the same image
    assert f"{sets['image.repository']}:{sets['image.tag']}".replace(REGISTRY_PLACEHOLDER, registry) == \
        destination.removeprefix("docker://")
