"""Owner Pod, token Secret and BundleDelivery builders, and deterministic names."""

import kopf

from resident_operator import naming
from resident_operator.delivery import build_bundle_delivery, observe_delivery
from resident_operator.placement import build_owner_pod, build_token_secret
from resident_operator.settings import OperatorSettings
from resident_operator.spec import parse_spec

A = "sha256:" + "aa" * 32
B = "sha256:" + "bb" * 32
SETTINGS = OperatorSettings(owner_image="resident:dev")
MODEL_BODY = {"apiVersion": "resident.dev/v1alpha1", "kind": "ResidentModel",
              "metadata": {"name": "tiny", "namespace": "ns1", "uid": "model-uid-1"}}


def spec(**over):
    raw = {"bundle": {"source": "file:///m/tiny", "digest": A}}
    raw.update(over)
    return parse_spec(raw)


def pod_for(s, **kw):
    args = dict(slot=0, incarnation=0, bundle_digest=A, bundle_source="file:///m/tiny")
    args.update(kw)
    return build_owner_pod("tiny", "model-uid-1", s, SETTINGS, **args)


def test_accelerator_pod_requests_exactly_one_card():
    s = spec(accelerator="furiosa.ai/rngd", runtime={"backend": "rngd",
             "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}})
    c = pod_for(s)["spec"]["containers"][0]
    assert c["resources"]["requests"] == {"memory": "1Gi", "furiosa.ai/rngd": "1"}
    assert c["resources"]["limits"] == {"memory": "2Gi", "furiosa.ai/rngd": "1"}


def test_cpu_pod_requests_no_card():
    c = pod_for(spec())["spec"]["containers"][0]
    assert "resources" not in c


def test_the_cpu_backend_computes_on_the_whole_cpus_of_its_limit():
    def blas(runtime):
        env = pod_for(spec(runtime=runtime))["spec"]["containers"][0]["env"]
        return next((e["value"] for e in env if e["name"] == "OPENBLAS_NUM_THREADS"), None)
    assert blas({}) is None          # no limit: the owner's own default, one thread
    assert blas({"resources": {"limits": {"cpu": "2"}}}) == "2"
    assert blas({"resources": {"limits": {"cpu": 3}}}) == "3"
    assert blas({"resources": {"limits": {"cpu": "2500m"}}}) == "2"
    assert blas({"resources": {"limits": {"cpu": "500m"}}}) == "1"
    assert blas({"resources": {"requests": {"cpu": "4"}}}) is None    # a request is no cap
    for bad in ("lots", "1e400", "nan"):                              # the API server refuses the Pod
        assert blas({"resources": {"limits": {"cpu": bad}}}) is None
    assert blas({"backend": "torch", "resources": {"limits": {"cpu": "4"}}}) is None


def test_pod_carries_the_csi_volume_token_probe_and_labels():
    s = spec(nodeSelector={"zone": "a"}, tolerations=[{"key": "npu", "operator": "Exists",
                                                      "effect": "NoSchedule"}],
             runtime={"port": 9000, "warmup": True, "variants": [{"name": "b1"}]})
    pod = pod_for(s, slot=2, incarnation=1, bundle_digest=B)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    csi = vols["bundle"]["csi"]
    assert csi == {"driver": "bundles.resident.dev", "readOnly": True,
                   "volumeAttributes": {"digest": B, "source": "file:///m/tiny", "model": "tiny"}}
    assert vols["owner-token"]["secret"]["secretName"] == "tiny-owner-token"
    c = pod["spec"]["containers"][0]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["bundle"] == {"name": "bundle", "mountPath": "/bundle", "readOnly": True}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "control"}
    assert c["startupProbe"] == {"httpGet": {"path": "/readyz", "port": "control"},
                                 "periodSeconds": 1, "failureThreshold": 3600}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"control": 9000, "http": 8000}
    assert c["image"] == "resident:dev"
    assert c["command"][:2] == ["resident", "owner"] and "--warmup" in c["command"]
    assert c["command"][c["command"].index("--port") + 1] == "9000"
    assert c["command"][c["command"].index("--inference-port") + 1] == "8000"
    assert c["command"][c["command"].index("--model-name") + 1] == "tiny"
    assert "--api-key-file" not in c["command"] and "api-key" not in vols
    assert pod["spec"]["nodeSelector"] == {"zone": "a"}
    assert pod["spec"]["tolerations"][0] == {"key": "npu", "operator": "Exists", "value": "",
                                             "effect": "NoSchedule"}
    labels = pod["metadata"]["labels"]
    assert labels[naming.LABEL_MODEL] == "tiny" and labels[naming.LABEL_MODEL_UID] == "model-uid-1"
    assert labels[naming.LABEL_COMPONENT] == "owner" and labels[naming.LABEL_SLOT] == "2"
    assert pod["metadata"]["name"] == "tiny-owner-2-r1"


def test_the_models_credentials_secret_rides_on_the_bundle_volume_for_kubelet():
    source = "s3://models/tiny?endpoint=http://minio.storage:9000"
    s = spec(bundle={"source": source, "digest": A, "credentialsSecret": "s3-reader"})
    pod = pod_for(s, bundle_source=source)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["bundle"]["csi"]["nodePublishSecretRef"] == {"name": "s3-reader"}
    # nowhere else: not mounted into the owner, not in its environment or command line
    c = pod["spec"]["containers"][0]
    assert "s3-reader" not in str(c) and not any(v.get("secret", {}).get("secretName") == "s3-reader"
                                                 for v in vols.values())
    assert "nodePublishSecretRef" not in pod_for(spec())["spec"]["volumes"][0]["csi"]


def test_naming_another_credentials_secret_rolls_the_owners_and_a_new_revision_does_not():
    from resident_operator.pod_template import template_hash
    source = "s3://models/tiny"
    with_a = spec(bundle={"source": source, "digest": A, "credentialsSecret": "reader-a"})
    with_b = spec(bundle={"source": source, "digest": A, "credentialsSecret": "reader-b"})
    next_revision = spec(bundle={"source": source, "digest": B, "credentialsSecret": "reader-a"})
    assert template_hash("tiny", with_a, SETTINGS) != template_hash("tiny", with_b, SETTINGS)
    assert template_hash("tiny", with_a, SETTINGS) == template_hash("tiny", next_revision, SETTINGS)
    assert template_hash("tiny", spec(), SETTINGS) == template_hash(
        "tiny", spec(bundle={"source": "http://h/m", "digest": B}), SETTINGS)


def test_host_network_and_image_override_come_from_settings_and_spec():
    s = spec(runtime={"image": "custom:2"})
    pod = build_owner_pod("tiny", "u", s, OperatorSettings(owner_image="x", owner_host_network=True),
                          0, 0, A, "file:///m")
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["containers"][0]["image"] == "custom:2"


def test_host_network_gives_slot_k_the_ports_base_plus_k():
    s = spec(replicas=3, runtime={"port": 9000}, serving={"port": 7000})
    host = OperatorSettings(owner_image="x", owner_host_network=True)
    for slot in range(3):
        c = build_owner_pod("tiny", "u", s, host, slot, 0, A, "file:///m")["spec"]["containers"][0]
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == \
            {"control": 9000 + slot, "http": 7000 + slot}
        assert c["command"][c["command"].index("--port") + 1] == str(9000 + slot)
    # in its own network namespace every owner keeps the bases
    c = pod_for(s, slot=2)["spec"]["containers"][0]
    assert {p["containerPort"] for p in c["ports"]} == {9000, 7000}


def test_api_key_secret_is_mounted_and_passed_to_the_owner():
    s = spec(serving={"apiKeySecret": "tiny-keys"})
    pod = pod_for(s)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["api-key"]["secret"]["secretName"] == "tiny-keys"
    assert vols["api-key"]["secret"]["items"] == [{"key": "api-key", "path": "api-key"}]
    c = pod["spec"]["containers"][0]
    path = c["command"][c["command"].index("--api-key-file") + 1]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "api-key")
    assert path == mount["mountPath"] + "/api-key" and mount["readOnly"] is True


def test_scheduling_controls_reach_the_owner_pod():
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {"app": "x"}}}}]}}
    s = spec(affinity=affinity, priorityClassName="models-high", topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}])
    pod_spec = pod_for(s)["spec"]
    assert pod_spec["affinity"] == affinity and pod_spec["priorityClassName"] == "models-high"
    tsc, = pod_spec["topologySpreadConstraints"]
    # without a selector of its own, a constraint spreads this model's owners
    assert tsc["labelSelector"] == {"matchLabels": {naming.LABEL_MODEL_UID: "model-uid-1",
                                                    naming.LABEL_COMPONENT: "owner"}}
    assert "affinity" not in pod_for(spec())["spec"]


def test_owner_pods_run_as_non_root_unless_the_installation_relaxes_it():
    assert pod_for(spec())["spec"]["securityContext"]["runAsNonRoot"] is True
    vendor = OperatorSettings(owner_image="vendor:1", owner_run_as_non_root=False)
    pod = build_owner_pod("tiny", "u", spec(), vendor, 0, 0, A, "file:///m")
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is False
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_adopt_adds_the_controller_owner_reference():
    pod = pod_for(spec())
    kopf.adopt(pod, owner=MODEL_BODY)
    ref, = pod["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == \
        ("ResidentModel", "tiny", "model-uid-1", True)
    assert pod["metadata"]["namespace"] == "ns1"


def test_names_are_deterministic_and_fit_63_characters():
    assert naming.owner_pod_name("m", 0) == naming.owner_pod_name("m", 0) == "m-owner-0"
    long = "x" * 80
    n1, n2 = naming.owner_pod_name(long, 3, 12), naming.owner_pod_name(long + "y", 3, 12)
    assert len(n1) <= 63 and n1.endswith("-owner-3-r12") and n1 != n2
    d = naming.delivery_name(long, 1, 0, B)
    assert len(d) <= 63 and d.endswith("-1-" + "bb" * 6)
    assert naming.delivery_name("m", 1, 0, A) != naming.delivery_name("m", 1, 0, B)


def test_token_secret():
    sec = build_token_secret("tiny", "u1", "t0ken")
    assert sec["metadata"]["name"] == "tiny-owner-token" and sec["stringData"] == {"token": "t0ken"}
    assert sec["metadata"]["labels"][naming.LABEL_COMPONENT] == "token"


def test_bundle_delivery_names_pod_by_uid_and_the_donor():
    bd = build_bundle_delivery("tiny", "u1", spec(delivery={"rebase": "Never", "minReuse": 0.7}),
                               slot=0, incarnation=0, pod_name="tiny-owner-0", pod_uid="pod-uid",
                               node_name="node-a", target_digest=B, target_source="file:///m/b",
                               path="WholeBundle", donor_digest=A)
    s = bd["spec"]
    assert (s["podName"], s["podUID"], s["nodeName"], s["path"]) == \
        ("tiny-owner-0", "pod-uid", "node-a", "WholeBundle")
    assert s["bundle"] == {"source": "file:///m/b", "digest": B}
    assert (s["donor"], s["rebase"], s["minReuse"]) == (A, "Never", 0.7)
    assert bd["metadata"]["labels"][naming.LABEL_REVISION] == "bb" * 8


def test_observe_delivery():
    assert observe_delivery(None) is None
    o = observe_delivery({"status": {"phase": "Staged", "verified": True, "method": "rebase",
                                     "bytes": {"fetched": 5, "reused": 7, "written": 5}}})
    assert o.staged and not o.failed and (o.fetched, o.reused) == (5, 7)
    assert not observe_delivery({"status": {"phase": "Staged", "verified": False}}).staged
    assert observe_delivery({"status": {"phase": "Failed", "reason": "IntegrityMismatch"}}).failed
    assert observe_delivery({}).phase == "Pending"
