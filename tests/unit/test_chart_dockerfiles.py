"""docker/Dockerfile: builds from paths that exist, ships every runtime package, and runs
as the non-root user the chart expects. (No registry is reachable here, so the image is
not built in tests; the wheel step was checked by hand, see docs/install.md.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
IGNORE = REPO / "docker" / "Dockerfile.dockerignore"
NOT_IN_IMAGE = {"localcluster"}  # the local test cluster, not a runtime component


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, rest in instructions():
        if word == "FROM":
            match = re.search(r"\bAS\s+(\S+)", rest, re.I)
            current = match.group(1) if match else rest
            out[current] = []
        elif current:
            out[current].append((word, rest))
    return out


def copied_sources() -> list[str]:
    sources = []
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    return sources


def test_every_copied_path_exists_and_passes_the_ignore_file():
    sources = copied_sources()
    assert sources
    allowed = {ln.lstrip("!").rstrip("/") for ln in IGNORE.read_text().splitlines() if ln.startswith("!")}
    for src in sources:
        assert (REPO / src).exists(), src
        assert src.rstrip("/") in allowed, f"{src} is filtered out by {IGNORE.name}"


def test_every_runtime_package_is_copied():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    find = pyproject["tool"]["setuptools"]["packages"]["find"]
    copied = {s.rstrip("/") for s in copied_sources()}
    for pattern in find["include"]:
        package = pattern.rstrip("*")
        if package in NOT_IN_IMAGE:
            continue
        homes = [w for w in find["where"] if (REPO / w / package).is_dir()]
        assert homes, package
        top = package if homes[0] == "." else homes[0]
        assert top in copied, f"package {package} ({top}/) is not copied into the image"


def test_final_images_run_as_the_non_root_user_the_chart_expects():
    values = yaml.safe_load((REPO / "charts" / "resident" / "values.yaml").read_text())
    by_stage = stages()
    for target in ("resident", "owner", "owner-torch"):
        users = [rest for word, rest in by_stage[target] if word == "USER"]
        assert users, f"stage {target} sets no USER"
        uid, _, gid = users[-1].partition(":")
        assert int(uid) != 0 and int(gid) != 0
        assert int(uid) == values["operator"]["runAsUser"] and int(gid) == values["operator"]["runAsGroup"]
    assert list(by_stage)[-1] == "resident"  # a plain `docker build` gives the operator/bridge image
