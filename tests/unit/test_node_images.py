"""Pure parts of the local node: OCI layout documents and tarballs, the wheel layer, the
kubelet and containerd configuration builders."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from localcluster.containerd import containerd_config, pod_network_config
from localcluster.kube_proxy import kube_proxy_config
from localcluster.kubelet import kubelet_argv, kubelet_config
from localcluster.images import export_archive
from localcluster.oci_layout import (ContainerConfig, OciLayoutError, check_image_name, image_documents, image_manifest,
                                     image_names, pack_layer, write_image_layout)
from localcluster.wheel_layer import ProjectTreeError, console_scripts, launcher, tree_digest, wheel_layer_tar


def make_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_pack_layer_digests_are_those_of_the_bytes(tmp_path):
    src = make_tar(tmp_path / "l.tar", {"bin/hello": b"hi\n"})
    layer = pack_layer(src, tmp_path / "l.tar.gz")
    assert layer.diff_id == "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
    assert layer.digest == "sha256:" + hashlib.sha256(layer.path.read_bytes()).hexdigest()
    assert layer.size == layer.path.stat().st_size
    again = pack_layer(src, tmp_path / "again.tar.gz")
    assert again.digest == layer.digest   # deterministic: gzip mtime 0


def test_pack_layer_refuses_a_non_tar(tmp_path):
    bad = tmp_path / "x.tar"
    bad.write_bytes(b"not a tar")
    with pytest.raises(OciLayoutError, match="not a tar"):
        pack_layer(bad, tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.mark.parametrize("name", ["resident:latest", "Resident.local/x:1", "resident.local/x", "a.b/x:"])
def test_bad_image_names_are_refused(name):
    with pytest.raises(OciLayoutError, match="bad image name"):
        check_image_name(name)


def test_image_documents_reference_config_and_layers(tmp_path):
    layer = pack_layer(make_tar(tmp_path / "l.tar", {"a": b"1"}), tmp_path / "l.tar.gz")
    index, blobs = image_documents("resident.local/resident:abc", [layer],
                                   ContainerConfig(env=["PATH=/bin"], entrypoint=["resident"], cmd=["--help"]))
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == "resident.local/resident:abc"
    manifest = json.loads(blobs[entry["digest"]])
    config = json.loads(blobs[manifest["config"]["digest"]])
    assert manifest["layers"][0]["digest"] == layer.digest
    assert config["rootfs"]["diff_ids"] == [layer.diff_id]
    assert config["config"] == {"Env": ["PATH=/bin"], "Entrypoint": ["resident"], "Cmd": ["--help"],
                                "WorkingDir": "/"}
    for digest, data in blobs.items():
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    with pytest.raises(OciLayoutError, match="at least one layer"):
        image_documents("resident.local/resident:abc", [], ContainerConfig())


def test_layout_tarball_round_trip(tmp_path):
    layer = pack_layer(make_tar(tmp_path / "l.tar", {"a": b"1"}), tmp_path / "l.tar.gz")
    out = write_image_layout(tmp_path / "img.tar", "resident.local/t:1", [layer], ContainerConfig(cmd=["/a"]))
    assert image_names(out) == ["resident.local/t:1"]
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json", f"blobs/sha256/{layer.digest.split(':')[1]}"} <= names
        blob = tar.extractfile(f"blobs/sha256/{layer.digest.split(':')[1]}").read()
    assert blob == layer.path.read_bytes()


def test_image_names_explains_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_names(tmp_path / "none.tar")
    unnamed = tmp_path / "unnamed.tar"
    make_tar(unnamed, {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}',
                       "index.json": json.dumps({"manifests": [{"digest": "sha256:00"}]}).encode()})
    with pytest.raises(OciLayoutError, match="io.containerd.image.name"):
        image_names(unnamed)
    foreign = make_tar(tmp_path / "foreign.tar", {"hello": b"x"})
    with pytest.raises(OciLayoutError, match="not an OCI image layout"):
        image_names(foreign)


def test_image_manifest_reads_the_one_image_and_checks_its_blobs(tmp_path):
    layer = pack_layer(make_tar(tmp_path / "l.tar", {"a": b"1"}), tmp_path / "l.tar.gz")
    out = write_image_layout(tmp_path / "img.tar", "resident.local/t:1", [layer],
                             ContainerConfig(entrypoint=["resident"], user="10001:10001"))
    image = image_manifest(out)
    with tarfile.open(out) as tar:
        index = json.load(tar.extractfile("index.json"))
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert image.digest == index["manifests"][0]["digest"]
    assert [entry["digest"] for entry in image.manifest["layers"]] == [layer.digest]
    assert image.config["config"]["Entrypoint"] == ["resident"] and image.config["config"]["User"] == "10001:10001"
    config_member = f"blobs/sha256/{image.manifest['config']['digest'].split(':')[1]}"
    members[config_member] = b"{}"     # a config that is not the one the manifest names
    make_tar(tmp_path / "bad.tar", members)
    with pytest.raises(OciLayoutError, match="does not match its digest"):
        image_manifest(tmp_path / "bad.tar")
    del members[config_member]
    make_tar(tmp_path / "missing.tar", members)
    with pytest.raises(OciLayoutError, match="is missing"):
        image_manifest(tmp_path / "missing.tar")


def test_an_exported_archive_is_a_copy_the_cache_cannot_change(tmp_path):
    layer = pack_layer(make_tar(tmp_path / "l.tar", {"a": b"1"}), tmp_path / "l.tar.gz")
    cached = write_image_layout(tmp_path / "resident-abc.oci.tar", "resident.local/resident:abc", [layer],
                                ContainerConfig())
    out = export_archive(cached, tmp_path / "dist" / "images", "resident.tar")
    assert out == tmp_path / "dist" / "images" / "resident.tar"
    assert out.read_bytes() == cached.read_bytes() and out.stat().st_ino != cached.stat().st_ino
    cached.unlink()                    # the cache pruned it
    assert image_manifest(out).manifest["layers"][0]["digest"] == layer.digest


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)
    return path


def test_wheel_layer_installs_files_and_console_scripts(tmp_path):
    wheel = make_wheel(tmp_path / "resident-0.1.0-py3-none-any.whl", {
        "resident_cli.py": b"def main(): return 0\n",
        "bundle/__init__.py": b"",
        "resident-0.1.0.dist-info/entry_points.txt": b"[console_scripts]\nresident = resident_cli:main\n",
    })
    scripts = wheel_layer_tar(wheel, "/opt/resident", "/opt/resident/lib/python3.11/site-packages", tmp_path / "a.tar")
    assert scripts == ["resident"]
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert "opt/resident/lib/python3.11/site-packages/bundle/__init__.py" in members
        script = tar.extractfile("opt/resident/bin/resident").read().decode()
    assert script.startswith("#!/opt/resident/bin/python\n") and "from resident_cli import main" in script
    assert members["opt/resident/bin/resident"].mode == 0o755
    assert members["usr/local/bin/resident"].linkname == "/opt/resident/bin/resident"


def test_wheel_layer_refuses_escaping_members_and_foreign_site_packages(tmp_path):
    evil = make_wheel(tmp_path / "evil-1-py3-none-any.whl", {"../../etc/passwd": b"x"})
    with pytest.raises(ProjectTreeError, match="cannot be installed"):
        wheel_layer_tar(evil, "/opt/resident", "/opt/resident/lib/python3.11/site-packages", tmp_path / "e.tar")
    ok = make_wheel(tmp_path / "ok-1-py3-none-any.whl", {"m.py": b""})
    with pytest.raises(ProjectTreeError, match="not inside the venv"):
        wheel_layer_tar(ok, "/opt/resident", "/usr/lib/python3/dist-packages", tmp_path / "o.tar")


def test_launcher_and_entry_points():
    assert launcher("/v", "pkg.mod:main").decode().splitlines() == [
        "#!/v/bin/python", "import sys", "from pkg.mod import main", "sys.exit(main())"]
    with zipfile.ZipFile(io.BytesIO(), "w") as empty:
        assert console_scripts(empty) == {}


def test_tree_digest_changes_with_content_mode_and_path(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = tree_digest(tmp_path, ["a.py"])
    assert tree_digest(tmp_path, ["a.py"]) == first
    (tmp_path / "a.py").write_text("x = 2\n")
    changed = tree_digest(tmp_path, ["a.py"])
    assert changed != first
    (tmp_path / "a.py").chmod(0o755)
    assert tree_digest(tmp_path, ["a.py"]) != changed
    (tmp_path / "a.py").rename(tmp_path / "b.py")
    assert tree_digest(tmp_path, ["b.py"]) not in (first, changed)


def test_kubelet_serves_on_its_node_address_with_a_ca_signed_certificate_and_refuses_anonymous(tmp_path):
    config = kubelet_config("10.200.0.10", tmp_path / "ca.crt", tmp_path / "k.crt", tmp_path / "k.key",
                            Path("/run/c.sock"))
    assert config["address"] == "10.200.0.10" and config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0
    assert config["tlsCertFile"] == str(tmp_path / "k.crt")
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert config["containerRuntimeEndpoint"] == "unix:///run/c.sock"
    # Pods learn of cluster DNS only, never of the machine's name servers
    assert config["clusterDNS"] == ["10.96.0.10"] and config["resolvConf"] == ""
    argv = kubelet_argv(Path("/b/kubelet"), tmp_path / "k.yaml", "/kc", "node-0", "10.200.0.10")
    assert "--root-dir=/var/lib/kubelet" in argv and "--hostname-override=node-0" in argv
    assert "--node-ip=10.200.0.10" in argv
    # a further node's kubelet keeps its Pods' cgroups under a root of its own
    assert kubelet_config("10.200.0.11", tmp_path / "ca.crt", tmp_path / "k.crt", tmp_path / "k.key",
                          Path("/run/c.sock"), cgroup_root="/resident-nodes/node-1")["cgroupRoot"] \
        == "/resident-nodes/node-1"


def test_pod_network_gives_addresses_from_the_node_range_behind_a_gateway():
    config = pod_network_config("10.244.3.0/24", Path("/run/x/ipam"))
    bridge, = config["plugins"]
    assert bridge["type"] == "bridge" and bridge["isGateway"] is True and bridge["hairpinMode"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]
    # each node keeps its own leases: host-local's default directory is machine-wide
    assert bridge["ipam"]["dataDir"] == "/run/x/ipam"


def test_kube_proxy_leaves_machine_wide_conntrack_settings_alone():
    config = kube_proxy_config("/kc", "node-0", "10.244.0.0/16")
    assert config["mode"] == "iptables" and config["hostnameOverride"] == "node-0"
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["healthzBindAddress"].startswith("127.0.0.1:")


def test_cluster_dns_forwards_nothing_and_runs_restricted():
    from localcluster.cluster_dns import COREFILE, dns_manifests

    assert "forward" not in COREFILE and "kubernetes cluster.local" in COREFILE
    kinds = {m["kind"]: m for m in dns_manifests("resident.local/coredns:1")}
    assert kinds["Service"]["spec"]["clusterIP"] == "10.96.0.10"
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_containerd_config_has_the_settings_this_machine_needs(tmp_path):
    text = containerd_config(Path("/r"), Path("/s"), Path("/s/c.sock"), "resident.local/pause:1", tmp_path)
    assert 'sandbox_image = "resident.local/pause:1"' in text
    assert "restrict_oom_score_adj = true" in text
    assert 'stream_server_address = "127.0.0.1"' in text
    assert f'conf_dir = "{tmp_path}"' in text
    import tomllib

    parsed = tomllib.loads(text)
    assert parsed["grpc"]["address"] == "/s/c.sock"


def test_project_tree_and_requirements_errors_are_clear(tmp_path):
    from localcluster.rootfs import RootfsError, python_requirements
    from localcluster.wheel_layer import project_files

    with pytest.raises(ProjectTreeError, match="not a git work tree"):
        project_files(tmp_path)
    bad = tmp_path / "pyproject.toml"
    bad.write_text("[project\nname = 1")
    with pytest.raises(RootfsError, match="cannot read dependencies"):
        python_requirements(bad)
    bad.write_text("[project]\nname = 'x'\n")
    with pytest.raises(RootfsError, match="no \\[project\\] dependencies"):
        python_requirements(bad)
    bad.write_text("[project]\ndependencies = ['b>=1', 'a']\n")
    assert python_requirements(bad) == ["a", "b>=1"]


def test_torch_layer_takes_only_what_the_base_lacks_and_refuses_unpinned_gpu_builds(tmp_path):
    from localcluster.rootfs import RootfsError
    from localcluster.torch_layer import new_wheels, torch_pins, torch_requirements

    def wheelhouse(*names):
        d = tmp_path / f"w{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for n in names:
            (d / n).touch()
        return list(d.glob("*.whl"))

    base = ["numpy==2.4.6", "PyYAML==6.0.4", "typing_extensions==4.16.0"]
    pins = ["nvidia-cuda-runtime==13.0.96", "torch==2.13.0"]
    cpu = wheelhouse("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.4.6-cp311-x.whl",
                     "nvidia_cuda_runtime-13.0.96-py3-none-x.whl",
                     "pyyaml-6.0.4-cp311-x.whl", "typing_extensions-4.16.0-py3-none-any.whl",
                     "transformers-5.24.0-py3-none-any.whl")
    assert [w.name.split("-")[0] for w in new_wheels(cpu, base, pins)] == [
        "nvidia_cuda_runtime", "torch", "transformers"]
    for gpu in ("triton-3.7.1-cp311-cp311-x.whl", "nvidia_cusolver-12.0.4.66-py3-none-x.whl",
                "nvidia_cuda_runtime-13.0.48-py3-none-x.whl", "cuda_bindings-13.5.0-cp311-x.whl"):
        with pytest.raises(RootfsError, match="GPU builds"):
            new_wheels(wheelhouse("torch-2.13.0-cp311-x.whl", gpu), base, pins)
    with pytest.raises(RootfsError, match="GPU builds"):
        new_wheels(wheelhouse("torch-2.14.1-cp311-x.whl"), base, pins)
    with pytest.raises(RootfsError, match="no torch wheel"):
        new_wheels(wheelhouse("transformers-5.24.0-py3-none-any.whl"), base, pins)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'x'\n")
    with pytest.raises(RootfsError, match="no \\[project.optional-dependencies\\] torch-deps"):
        torch_requirements(pyproject)
    pyproject.write_text("[project.optional-dependencies]\ntorch-deps = ['transformers', 'a']\n")
    assert torch_requirements(pyproject) == ["a", "transformers"]
    pins_file = tmp_path / "torch-cpu.txt"
    pins_file.write_text("# comment\ntorch==2.13.0\n\nnvidia-cublas==13.1.1.3  # why\n")
    assert torch_pins(pins_file) == ["nvidia-cublas==13.1.1.3", "torch==2.13.0"]
    pins_file.write_text("torch>=2.13\n")
    with pytest.raises(RootfsError, match="exact versions"):
        torch_pins(pins_file)
    pins_file.write_text("nvidia-cublas==13.1.1.3\n")
    with pytest.raises(RootfsError, match="does not pin torch"):
        torch_pins(pins_file)


def test_the_torch_wheelhouse_keeps_the_pinned_wheels_only(tmp_path):
    """What pip downloaded stays for the next install; wheels of other versions go."""
    from localcluster.rootfs import RootfsError
    from localcluster.torch_layer import fetch_pinned_wheels

    pip = tmp_path / "pip"   # stands in for `pip download`, which finds every wheel present
    pip.write_text("#!/bin/sh\nexit 0\n")
    pip.chmod(0o755)
    house = tmp_path / "wheels"
    house.mkdir()
    for name in ("torch-2.13.0-cp311-x.whl", "torch-2.12.1-cp311-x.whl", "nvidia_cublas-13.1.1.3-py3-none-x.whl"):
        (house / name).touch()
    pins = ["nvidia-cublas==13.1.1.3", "torch==2.13.0"]
    assert [w.name for w in fetch_pinned_wheels(pins, house, pip)] == [
        "nvidia_cublas-13.1.1.3-py3-none-x.whl", "torch-2.13.0-cp311-x.whl"]
    assert sorted(w.name for w in house.glob("*.whl")) == [
        "nvidia_cublas-13.1.1.3-py3-none-x.whl", "torch-2.13.0-cp311-x.whl"]
    with pytest.raises(RootfsError, match="no wheel for .*nvidia-nccl-cu13"):
        fetch_pinned_wheels([*pins, "nvidia-nccl-cu13==2.29.7"], house, pip)


def test_the_repositorys_torch_cpu_pins_torch_as_the_extra_does():
    """The CPU-only install and the normal extra install the same torch."""
    from localcluster.images import REPO
    from localcluster.torch_layer import torch_pins

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["torch"]
    pinned_torch = [p for p in torch_pins(REPO / "torch-cpu.txt") if p.startswith("torch==")]
    assert pinned_torch and pinned_torch[0] in extra
    assert "resident[torch-deps]" in extra


def test_torch_layers_and_images_are_pruned_apart_from_the_project_cache(tmp_path):
    import os

    from localcluster.images import _prune, _prune_layers, cached_image_names

    names = ["base-b1.tar.gz", "base-b2.tar.gz", "resident-p1.oci.tar", "app-p1.tar.gz", "app-p1.json",
             *[f"torch-t{i}.tar.gz" for i in range(4)], *[f"torch-t{i}.json" for i in range(4)],
             *[f"owner-torch-o{i}.oci.tar" for i in range(3)]]
    for age, name in enumerate(names):
        (tmp_path / name).touch()
        os.utime(tmp_path / name, (1000 + age, 1000 + age))
    _prune_layers(tmp_path, "torch", keep="t0", count=2)   # t3, t2 newest; t0 kept by key
    assert sorted(p.name for p in tmp_path.glob("torch-*")) == [
        "torch-t0.json", "torch-t0.tar.gz", "torch-t2.json", "torch-t2.tar.gz", "torch-t3.json", "torch-t3.tar.gz"]
    _prune(tmp_path, keep={"p1"}, keep_base="b2")
    left = {p.name for p in tmp_path.iterdir()}
    assert {"base-b1.tar.gz", "base-b2.tar.gz", "app-p1.json", "owner-torch-o0.oci.tar"} <= left
    assert cached_image_names(tmp_path) == {"resident.local/resident:p1", *{
        f"resident.local/owner-torch:o{i}" for i in range(3)}}
