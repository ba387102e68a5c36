"""The Helm chart, linted and released with Helm's own library against the real API server.

Every object is really created, so the API server's validation (Pod templates with a
privileged container and Bidirectional propagation, the CSIDriver, the CRDs, RBAC) is
the judge. There is no kubelet here: the Deployment's Pod is created by the real
controller-manager and stays Pending, the DaemonSet has no node to run on.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from charts.helmenv import CHART_DIR, Helm, HelmFailed  # noqa: E402
from polling import wait_for  # noqa: E402

INSTANCE = "app.kubernetes.io/instance"
CRDS = ("residentmodels.resident.dev", "bundledeliveries.resident.dev")
CLUSTER_KINDS = "clusterroles,clusterrolebindings,csidrivers"
NAMESPACED_KINDS = "deployments,daemonsets,replicasets,pods,services,serviceaccounts,configmaps,networkpolicies"


def get(cluster, *args) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def items(cluster, kinds: str, selector: str, namespace: str | None = None) -> list[dict]:
    scope = ["-n", namespace] if namespace else []
    return get(cluster, kinds, *scope, "-l", selector)["items"]


def as_set(env: dict) -> dict[str, str]:
    """Environment values as the container gets them: "" where the API server dropped an
    empty value (a valueFrom reference, too, until the caller fills it in)."""
    return {k: v or "" for k, v in env.items()}


def containers(pod_spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec["containers"]}


def effective(pod_spec: dict, container: dict, field: str):
    """A security field as the container runs it: its own value, else the Pod's."""
    own = (container.get("securityContext") or {}).get(field)
    return own if own is not None else (pod_spec.get("securityContext") or {}).get(field)


def assert_restricted(pod_spec: dict, container: dict):
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged")
    assert effective(pod_spec, container, "runAsNonRoot") is True
    assert effective(pod_spec, container, "runAsUser") not in (None, 0)
    assert effective(pod_spec, container, "seccompProfile") == {"type": "RuntimeDefault"}


def assert_only_bridge_privileged_or_root(*pod_specs: dict):
    """The acceptance rule: no container but the bridge plugin is privileged or root."""
    for spec in pod_specs:
        for c in spec["containers"]:
            if c["name"] == "bridge":
                continue
            assert not (c.get("securityContext") or {}).get("privileged"), c["name"]
            assert effective(spec, c, "runAsUser") not in (None, 0), c["name"]
            assert effective(spec, c, "runAsNonRoot") is True, c["name"]


@pytest.fixture
def helm(cluster, namespace):
    return Helm(cluster.kubeconfig, namespace)


def test_chart_lints_clean(helm):
    report = helm.lint()
    assert report["TotalChartsLinted"] == 1 and not report["Errors"]
    assert [m for m in report["Messages"] if m["Severity"] >= 2] == []  # no warnings or errors


def test_lint_catches_a_broken_template(helm, tmp_path):
    chart = tmp_path / "resident"
    shutil.copytree(CHART_DIR, chart)
    with (chart / "templates" / "csidriver.yaml").open("a") as f:
        f.write("{{ .Values.noSuchSection.field }}\n")
    report = helm.lint(chart)
    assert report["Errors"] and any(m["Severity"] == 3 and m["Path"] == "templates/"
                                    for m in report["Messages"])


SUPPORTED_KUBERNETES = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"]   # the chart's kubeVersion range


def test_rendered_chart_is_valid_for_current_kubernetes(helm):
    """Every object the chart renders (CRDs included) against the OpenAPI schemas of every
    minor the chart declares, strictly (an unknown field fails). The API servers here run
    the two ends of that range; the schemas cover the minors between them."""
    import kubernetes_validate
    import yaml

    release = f"rv-{uuid.uuid4().hex[:6]}"
    manifest = helm.install(release, {}, take_ownership=True)["manifest"]
    try:
        docs = [d for d in yaml.safe_load_all(manifest) if d]
        assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "Deployment", "DaemonSet",
                                             "ClusterRole", "CSIDriver"}
        for version in SUPPORTED_KUBERNETES:
            for doc in docs:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    pytest.fail(f"{doc['kind']} {doc['metadata']['name']} is invalid for {version}: {e}")
    finally:
        helm.uninstall(release)


def test_install_upgrade_uninstall(cluster, namespace, helm):
    release = f"rs-{uuid.uuid4().hex[:6]}"
    full = f"{release}-resident"
    selector = f"{INSTANCE}={release}"
    # The session's cluster fixture created the CRDs from crds/ already: take_ownership
    # lets the release adopt them. crds.keep stays true, so uninstall leaves them for the
    # other tests of the session.
    installed = helm.install(release, {}, take_ownership=True)
    try:
        assert installed["status"] == "deployed" and installed["version"] == 1

        # -- operator: one replica, leader election, kopf liveness, restricted -------------
        deploy = get(cluster, "deployment", "-n", namespace, f"{full}-operator")
        assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
        pod_spec = deploy["spec"]["template"]["spec"]
        op = containers(pod_spec)["operator"]
        assert op["args"][:2] == ["operator", "--all-namespaces"] and "--verbose" not in op["args"]
        assert {"--liveness=http://$(POD_IP):8080/healthz", "--metrics-host=$(POD_IP)", "--leader-elect",
                f"--leader-election-namespace={namespace}",
                f"--leader-election-id={full}-operator"} <= set(op["args"])
        role = get(cluster, "role", "-n", namespace, f"{full}-operator-leader")
        assert role["rules"][1]["resourceNames"] == [f"{full}-operator"]
        assert op["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}
        assert {p["name"]: p["containerPort"] for p in op["ports"]} == {"health": 8080, "metrics": 9090}
        env = {e["name"]: e.get("value") for e in op["env"]}
        assert env["RESIDENT_OWNER_IMAGE"] == "ghcr.io/resident-dev/resident:0.1.0"   # one project image
        assert env["RESIDENT_OWNER_HOST_NETWORK"] == "false" and not pod_spec.get("hostNetwork")
        assert env["RESIDENT_OWNER_RUN_AS_NON_ROOT"] == "true"
        assert env["RESIDENT_NODE_LOSS_TOLERATION_SECONDS"] == "10"   # owners leave a lost node after 10 s
        assert (env["RESIDENT_OWNER_SPREAD_TOPOLOGY_KEY"], env["RESIDENT_OWNER_SPREAD_MAX_SKEW"],
                env["RESIDENT_OWNER_SPREAD_WHEN_UNSATISFIABLE"]) == ("kubernetes.io/hostname", "1", "ScheduleAnyway")
        assert_restricted(pod_spec, op)
        assert pod_spec["serviceAccountName"] == f"{full}-operator"
        # no monitoring.coreos.com kinds on this API server: discovery auto annotates the Pods
        scrape = deploy["spec"]["template"]["metadata"]["annotations"]
        assert (scrape["prometheus.io/scrape"], scrape["prometheus.io/port"]) == ("true", "9090")
        assert env["RESIDENT_OWNER_SCRAPE_ANNOTATIONS"] == "true"
        # the controller-manager made the Pod from the template and the API server admitted it
        pods = wait_for(lambda: items(cluster, "pods", selector, namespace), what="the operator Pod", every=0.3)
        assert_restricted(pods[0]["spec"], containers(pods[0]["spec"])["operator"])

        # -- bridge: privileged plugin, Bidirectional, no sidecar, hostPaths ----------------
        ds = get(cluster, "daemonset", "-n", namespace, f"{full}-bridge")
        bspec = ds["spec"]["template"]["spec"]
        cs = containers(bspec)
        assert set(cs) == {"bridge"}  # builtin: the bridge registers and serves /healthz itself
        assert ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9810"
        plugin = cs["bridge"]
        assert plugin["securityContext"]["privileged"] is True
        mounts = {m["name"]: m for m in plugin["volumeMounts"]}
        assert mounts["pods-dir"]["mountPath"] == "/var/lib/kubelet/pods"
        assert mounts["pods-dir"]["mountPropagation"] == "Bidirectional"
        assert "mountPropagation" not in mounts["store"]
        hostpaths = {v["name"]: v["hostPath"]["path"] for v in bspec["volumes"] if "hostPath" in v}
        assert hostpaths == {"socket-dir": "/var/lib/kubelet/plugins/bundles.resident.dev",
                             "pods-dir": "/var/lib/kubelet/pods",
                             "store": "/var/lib/resident-bridge",
                             "registration-dir": "/var/lib/kubelet/plugins_registry"}
        assert "--endpoint=unix:///csi/csi.sock" in plugin["args"]
        assert plugin["command"] == ["resident", "bridge"]       # no umask wrapper: sockets are 0660
        assert "--pods-dir=/var/lib/kubelet/pods" in plugin["args"]
        assert "--registration-dir=/registration" in plugin["args"]
        assert ("--kubelet-endpoint=/var/lib/kubelet/plugins/bundles.resident.dev/csi.sock"
                in plugin["args"])
        assert "--authorize=api" in plugin["args"] and "--deliveries" in plugin["args"]
        assert {"--gc-high-water-percent=70", "--gc-low-water-percent=50",  # GC on by default
                "--gc-interval=60"} <= set(plugin["args"])
        assert "--healthz-port=9808" in plugin["args"]
        assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz", "scheme": "HTTP"}
        assert {"name": "healthz", "containerPort": 9808, "protocol": "TCP"} in plugin["ports"]
        assert_only_bridge_privileged_or_root(pod_spec, bspec)

        # -- CSIDriver, CRDs, Services, RBAC ------------------------------------------------
        driver = get(cluster, "csidriver", "bundles.resident.dev")["spec"]
        assert driver["attachRequired"] is False and driver["podInfoOnMount"] is True
        assert driver["volumeLifecycleModes"] == ["Ephemeral"]
        assert driver["fsGroupPolicy"] == "None"
        assert driver["requiresRepublish"] is True   # volume credentials come back after a restart
        for name in CRDS:
            crd = get(cluster, "crd", name)
            assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
            assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        services = {s["metadata"]["name"]: s["spec"] for s in items(cluster, "services", selector, namespace)}
        assert services[f"{full}-operator-metrics"]["ports"][0]["port"] == 9090
        assert services[f"{full}-bridge-metrics"]["clusterIP"] == "None"
        roles = {r["metadata"]["name"] for r in items(cluster, "clusterroles", selector)}
        assert roles == {f"{full}-operator", f"{full}-bridge"}
        # owners' control port: the operator creates a NetworkPolicy with each model, in the
        # model's namespace (tests/cluster/test_operator_lifecycle.py); the chart tells it who
        # it is (its namespace from the downward API, its Pod labels) and makes no policy itself
        assert env["RESIDENT_OWNER_NETWORK_POLICY"] == "true"
        selector_labels = deploy["spec"]["selector"]["matchLabels"]
        assert env["RESIDENT_OPERATOR_POD_LABELS"] == ",".join(f"{k}={v}" for k, v in sorted(selector_labels.items()))
        assert selector_labels.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
        assert not env["RESIDENT_OPERATOR_NAMESPACE_LABELS"]   # "": the API server drops the value
        namespace_env, = (e for e in op["env"] if e["name"] == "RESIDENT_OPERATOR_NAMESPACE")
        assert namespace_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert items(cluster, "networkpolicies", selector, namespace) == []
        from resident_operator.control_policy import operator_peer
        from resident_operator.settings import settings_from_env
        assert operator_peer(settings_from_env({**as_set(env), "RESIDENT_OPERATOR_NAMESPACE": namespace})) == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": selector_labels}}
        assert not any(r["resources"] == ["namespaces"] for r in get(
            cluster, "clusterrole", f"{full}-operator")["rules"])   # --all-namespaces needs none

        # -- a bad upgrade is refused and the release keeps what it had ------------------
        with pytest.raises(HelmFailed, match="schema"):
            helm.upgrade(release, {"bridge": {"livenessProbe": {"port": 70000}}})
        assert helm.status(release)["version"] == 1
        assert get(cluster, "daemonset", "-n", namespace, f"{full}-bridge")["spec"] == ds["spec"]

        # -- upgrade with changed values ----------------------------------------------------
        changed = {
            "image": {"repository": "localhost/resident", "tag": "dev", "pullPolicy": "Never"},
            "operator": {"hostNetwork": True, "bindAddress": "127.0.0.1", "logLevel": "DEBUG",
                         "watchNamespaces": ["models", "team-*"],
                         "owner": {"host": "127.0.0.1", "hostNetwork": True, "runAsNonRoot": False,
                                   "networkPolicy": {"enabled": False}}},
            "bridge": {"hostNetwork": True, "bindAddress": "127.0.0.1", "registration": {"mode": "sidecar"},
                       "livenessProbe": {"enabled": False},
                       "gc": {"highWaterBytes": 50 << 30}},
            "metrics": {"service": False},
        }
        upgraded = helm.upgrade(release, changed)
        assert upgraded["status"] == "deployed" and upgraded["version"] == 2
        pod_spec = get(cluster, "deployment", "-n", namespace, f"{full}-operator")["spec"]["template"]["spec"]
        op = containers(pod_spec)["operator"]
        assert pod_spec["hostNetwork"] is True and pod_spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert (op["image"], op["imagePullPolicy"]) == ("localhost/resident:dev", "Never")
        env = {e["name"]: e.get("value") for e in op["env"]}
        assert env["RESIDENT_OWNER_HOST"] == "127.0.0.1" and env["RESIDENT_OWNER_HOST_NETWORK"] == "true"
        assert env["RESIDENT_OWNER_RUN_AS_NON_ROOT"] == "false"
        assert env["RESIDENT_OWNER_IMAGE"] == "localhost/resident:dev"   # owners follow the project image
        assert op["args"][1:3] == ["--namespace=models", "--namespace=team-*"]
        assert "--all-namespaces" not in op["args"]
        assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in get(
            cluster, "clusterrole", f"{full}-operator")["rules"]
        assert env["RESIDENT_OWNER_NETWORK_POLICY"] == "false"
        assert {"--metrics-host=127.0.0.1", "--liveness=http://127.0.0.1:8080/healthz"} <= set(op["args"])
        assert op["livenessProbe"]["httpGet"]["host"] == "127.0.0.1" and "--verbose" in op["args"]
        bspec = get(cluster, "daemonset", "-n", namespace, f"{full}-bridge")["spec"]["template"]["spec"]
        cs = containers(bspec)
        assert set(cs) == {"bridge", "node-driver-registrar"} and bspec["hostNetwork"] is True
        assert cs["node-driver-registrar"]["imagePullPolicy"] == "IfNotPresent"  # not image.pullPolicy
        assert cs["bridge"]["imagePullPolicy"] == "Never"
        assert cs["node-driver-registrar"]["args"] == [
            "--v=2", "--csi-address=/csi/csi.sock",
            "--kubelet-registration-path=/var/lib/kubelet/plugins/bundles.resident.dev/csi.sock"]
        assert not any(a.startswith("--registration-dir") for a in cs["bridge"]["args"])
        assert "--metrics-address=127.0.0.1" in cs["bridge"]["args"]
        assert f"--gc-high-water-bytes={50 << 30}" in cs["bridge"]["args"]  # bytes replace the shares
        assert not any(a.startswith("--gc-low-water") or "percent" in a for a in cs["bridge"]["args"])
        assert "livenessProbe" not in cs["bridge"]
        assert items(cluster, "services", selector, namespace) == []
    finally:
        uninstalled = helm.uninstall(release)

    # -- uninstall: nothing left but the kept CRDs ----------------------------------------
    assert uninstalled is not None
    assert items(cluster, CLUSTER_KINDS, selector) == []
    wait_for(lambda: items(cluster, NAMESPACED_KINDS, selector, namespace) == [], what="the release's Pods and ReplicaSets to be collected", every=0.3)
    assert items(cluster, "secrets", f"owner=helm,name={release}", namespace) == []
    for name in CRDS:
        assert get(cluster, "crd", name)["metadata"]["name"] == name


PROBE_TIMINGS = {"initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 3,
                 "failureThreshold": 5, "terminationGracePeriodSeconds": 5}


def rendered_bridge(helm, bridge_values: dict) -> dict:
    """The bridge DaemonSet's Pod spec as Helm renders it with ``bridge_values``: a release
    of the bridge alone, installed (Helm's library renders only against an API server) and
    uninstalled again."""
    import yaml

    release = f"lp-{uuid.uuid4().hex[:6]}"
    manifest = helm.install(release, {"crds": {"enabled": False}, "operator": {"enabled": False},
                                      "csiDriver": {"create": False}, "bridge": bridge_values})["manifest"]
    try:
        ds, = (d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "DaemonSet")
        return ds["spec"]["template"]["spec"]
    finally:
        helm.uninstall(release)


def test_bridge_liveness_probe_calls_the_csi_probe_in_both_registration_modes(helm):
    """builtin: the bridge serves /healthz itself (--healthz-port); sidecar: the CSI
    project's livenessprobe does. kubelet's probe of the plugin container is the same."""
    builtin = containers(rendered_bridge(helm, {}))
    assert set(builtin) == {"bridge"}
    assert "--healthz-port=9808" in builtin["bridge"]["args"]
    assert builtin["bridge"]["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "healthz"}, **PROBE_TIMINGS}
    assert {"name": "healthz", "containerPort": 9808, "protocol": "TCP"} in builtin["bridge"]["ports"]

    spec = rendered_bridge(helm, {"registration": {"mode": "sidecar"}, "livenessProbe": {"port": 9911}})
    sidecar = containers(spec)
    assert set(sidecar) == {"bridge", "node-driver-registrar", "liveness-probe"}
    assert not any(a.startswith("--healthz-port") for a in sidecar["bridge"]["args"])
    assert sidecar["bridge"]["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "healthz"}, **PROBE_TIMINGS}
    assert {"name": "healthz", "containerPort": 9911, "protocol": "TCP"} in sidecar["bridge"]["ports"]
    assert sidecar["liveness-probe"]["args"] == ["--csi-address=/csi/csi.sock", "--health-port=9911"]
    assert_restricted(spec, sidecar["liveness-probe"])

    # on the node's network with a bind address, kubelet probes that address
    host = containers(rendered_bridge(helm, {"hostNetwork": True, "bindAddress": "127.0.0.1"}))
    assert host["bridge"]["livenessProbe"]["httpGet"] == {"host": "127.0.0.1", "path": "/healthz",
                                                         "port": "healthz"}
    assert {"--metrics-address=127.0.0.1", "--healthz-port=9808"} <= set(host["bridge"]["args"])

    for mode in ("builtin", "sidecar"):
        off = containers(rendered_bridge(helm, {"registration": {"mode": mode},
                                                "livenessProbe": {"enabled": False}}))
        assert "livenessProbe" not in off["bridge"] and "liveness-probe" not in off
        assert not any(a.startswith("--healthz-port") for a in off["bridge"]["args"])
        assert "healthz" not in {p["name"] for p in off["bridge"]["ports"]}


@pytest.mark.parametrize("values, complaint", [
    ({"bridge": {"hostNetwrok": True}}, "hostNetwrok"),
    ({"operator": {"runAsUser": 0}}, "runAsUser"),
    ({"bridge": {"registration": {"mode": "both"}}}, "mode"),
    ({"bridge": {"kubeletDir": "var/lib/kubelet"}}, "kubeletDir"),
    ({"operator": {"bindAddress": "localhost"}}, "bindAddress"),
    ({"bridge": {"gc": {"highWaterPercent": 150}}}, "highWaterPercent"),
    # the chart's per-namespace policies are gone: the operator makes one per model
    ({"operator": {"owner": {"networkPolicy": {"namespaces": ["team-a"]}}}}, "namespaces"),
    ({"operator": {"owner": {"nodeLossToleranceSeconds": -1}}}, "nodeLossToleranceSeconds"),
    ({"operator": {"owner": {"spread": {"whenUnsatisfiable": "Never"}}}}, "whenUnsatisfiable"),
])
def test_bad_values_are_refused_before_anything_is_created(cluster, namespace, helm, values, complaint):
    release = f"bad-{uuid.uuid4().hex[:6]}"
    with pytest.raises(HelmFailed) as failure:
        helm.install(release, {"crds": {"enabled": False}, **values})
    assert complaint in failure.value.message and "schema" in failure.value.message.lower()
    selector = f"{INSTANCE}={release}"
    assert items(cluster, CLUSTER_KINDS, selector) == []
    assert items(cluster, NAMESPACED_KINDS + ",secrets", selector, namespace) == []
    assert items(cluster, "secrets", f"owner=helm,name={release}", namespace) == []


def access_review(cluster, namespace: str, release: str):
    """``can(component, verb, resource, ns)``: the real RBAC authorizer's answer
    (SubjectAccessReview) for the release's ServiceAccount of that component."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(cluster.api_client())

    def can(sa: str, verb: str, resource: str, ns: str | None = "elsewhere") -> bool:
        name, _, sub = resource.partition("/")
        plural, _, group = name.partition(".")
        review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{namespace}:{release}-resident-{sa}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                    "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                namespace=ns, verb=verb, group=group, resource=plural,
                subresource=sub or None)))
        return authz.create_subject_access_review(review).status.allowed
    return can


def test_rbac_grants_what_the_components_need_and_no_more(cluster, namespace, helm):
    release = f"rb-{uuid.uuid4().hex[:6]}"
    helm.install(release, {"crds": {"enabled": False}, "csiDriver": {"create": False}})
    try:
        can = access_review(cluster, namespace, release)

        # asked of the real RBAC authorizer (SubjectAccessReview) for another namespace
        for verb, resource in [("create", "pods"), ("delete", "pods"), ("create", "secrets"),
                               ("watch", "residentmodels.resident.dev"),
                               ("patch", "residentmodels.resident.dev/status"),
                               ("create", "bundledeliveries.resident.dev"), ("create", "events"),
                               ("list", "events"), ("watch", "events"),   # kubelet's FailedMount
                               ("patch", "bundledeliveries.resident.dev"),   # a stuck finalizer
                               ("get", "networkpolicies.networking.k8s.io"),   # one per model
                               ("watch", "networkpolicies.networking.k8s.io"),
                               ("create", "networkpolicies.networking.k8s.io"),
                               ("patch", "networkpolicies.networking.k8s.io"),
                               ("delete", "networkpolicies.networking.k8s.io"),
                               ("watch", "customresourcedefinitions.apiextensions.k8s.io")]:
            assert can("operator", verb, resource), (verb, resource)
        for verb, resource in [("update", "nodes"), ("get", "configmaps"), ("create", "deployments.apps"),
                               ("patch", "pods"),
                               ("create", "clusterroles.rbac.authorization.k8s.io"), ("create", "pods/exec"),
                               ("patch", "bundledeliveries.resident.dev/status"),
                               ("update", "networkpolicies.networking.k8s.io"),
                               ("deletecollection", "networkpolicies.networking.k8s.io"),
                               ("create", "ingresses.networking.k8s.io")]:
            assert not can("operator", verb, resource), (verb, resource)
        for verb, resource in [("get", "residentmodels.resident.dev"),
                               ("watch", "bundledeliveries.resident.dev"),
                               ("patch", "bundledeliveries.resident.dev"),
                               ("patch", "bundledeliveries.resident.dev/status"), ("create", "events"),
                               ("get", "pods")]:  # the orphan sweep reads one Pod by name
            assert can("bridge", verb, resource), (verb, resource)
        for verb, resource in [("get", "secrets"), ("create", "pods"), ("list", "pods"), ("watch", "pods"), ("patch", "residentmodels.resident.dev"),
                               ("patch", "residentmodels.resident.dev/status"),
                               ("create", "bundledeliveries.resident.dev"), ("get", "nodes"),
                               ("get", "networkpolicies.networking.k8s.io")]:
            assert not can("bridge", verb, resource), (verb, resource)
        # peer delivery is off by default: no token reviews, no list of its own Pods
        assert not can("bridge", "create", "tokenreviews.authentication.k8s.io", ns=None)
        assert not can("bridge", "list", "pods", ns=namespace)
    finally:
        helm.uninstall(release)


def test_peer_delivery_serves_a_port_with_a_peer_token_and_grants_only_what_it_needs(cluster, namespace, helm):
    import yaml

    release = f"pd-{uuid.uuid4().hex[:6]}"
    manifest = helm.install(release, {"crds": {"enabled": False}, "csiDriver": {"create": False},
                                      "operator": {"enabled": False},
                                      "bridge": {"peers": {"enabled": True, "port": 9931}}})["manifest"]
    try:
        ds, = (d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "DaemonSet")
        spec = ds["spec"]["template"]["spec"]
        plugin = containers(spec)["bridge"]
        assert {"name": "peers", "containerPort": 9931, "protocol": "TCP"} in plugin["ports"]
        assert {"--peer-port=9931", f"--peer-account=system:serviceaccount:{namespace}:{release}-resident-bridge",
                f"--peer-selector=app.kubernetes.io/component=bridge,app.kubernetes.io/instance={release}",
                "--peer-token-file=/var/run/secrets/resident/peer/token"} <= set(plugin["args"])
        token, = (v for v in spec["volumes"] if v["name"] == "peer-token")
        assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "peers.resident.dev"
        can = access_review(cluster, namespace, release)
        assert can("bridge", "create", "tokenreviews.authentication.k8s.io", ns=None)
        assert can("bridge", "list", "pods", ns=namespace)           # its own DaemonSet's Pods
        assert not can("bridge", "list", "pods", ns="elsewhere")
        assert not can("bridge", "watch", "pods", ns=namespace)
    finally:
        helm.uninstall(release)


def test_operator_namespace_labels_reach_the_operator(cluster, namespace, helm):
    """operator.owner.networkPolicy.operatorNamespaceLabels (for clusters before 1.21, whose
    Namespaces lack kubernetes.io/metadata.name) become the peer's namespace selector."""
    release = f"np-{uuid.uuid4().hex[:6]}"
    helm.install(release, {"crds": {"enabled": False}, "csiDriver": {"create": False},
                           "bridge": {"enabled": False},
                           "operator": {"owner": {"networkPolicy": {
                               "operatorNamespaceLabels": {"team": "platform", "tier": "infra"}}}}})
    try:
        op = containers(get(cluster, "deployment", "-n", namespace,
                            f"{release}-resident-operator")["spec"]["template"]["spec"])["operator"]
        env = {e["name"]: e.get("value") for e in op["env"]}
        assert env["RESIDENT_OPERATOR_NAMESPACE_LABELS"] == "team=platform,tier=infra"
        from resident_operator.control_policy import operator_peer
        from resident_operator.settings import settings_from_env
        peer = operator_peer(settings_from_env({**as_set(env), "RESIDENT_OPERATOR_NAMESPACE": namespace}))
        assert peer["namespaceSelector"] == {"matchLabels": {"team": "platform", "tier": "infra"}}
        assert items(cluster, "networkpolicies", f"{INSTANCE}={release}", namespace) == []
    finally:
        helm.uninstall(release)


def test_a_vendor_owner_image_replaces_the_project_image(cluster, namespace, helm):
    """Owners run the project image unless operator.owner.image names another (e.g. a vendor
    SDK image); its tag defaults to the chart's appVersion, not to image.tag."""
    release = f"ow-{uuid.uuid4().hex[:6]}"
    helm.install(release, {"crds": {"enabled": False}, "csiDriver": {"create": False}, "bridge": {"enabled": False},
                           "image": {"tag": "dev"},
                           "operator": {"owner": {"image": {"repository": "vendor.example/owner"}}}})
    try:
        op = containers(get(cluster, "deployment", "-n", namespace,
                            f"{release}-resident-operator")["spec"]["template"]["spec"])["operator"]
        env = {e["name"]: e.get("value") for e in op["env"]}
        assert op["image"] == "ghcr.io/resident-dev/resident:dev"
        assert env["RESIDENT_OWNER_IMAGE"] == "vendor.example/owner:0.1.0"
    finally:
        helm.uninstall(release)


def test_bridge_pod_is_admitted_on_a_node(cluster, namespace, helm):
    """The DaemonSet controller makes a real bridge Pod once a Node exists, and the API
    server admits it: privileged plugin, Bidirectional propagation, its own liveness probe."""
    release = f"nd-{uuid.uuid4().hex[:6]}"
    node = f"chart-node-{uuid.uuid4().hex[:6]}"
    helm.install(release, {"crds": {"enabled": False}, "operator": {"enabled": False}})
    try:
        # There is no kubelet: this test plays the node by creating its Node object only.
        cluster.kubectl("create", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
        pods = wait_for(lambda: items(cluster, "pods", f"{INSTANCE}={release}", namespace), what="the bridge Pod", every=0.3)
        spec = pods[0]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        cs = containers(spec)
        assert cs["bridge"]["securityContext"]["privileged"] is True
        assert {m["mountPath"]: m.get("mountPropagation") for m in cs["bridge"]["volumeMounts"]}[
            "/var/lib/kubelet/pods"] == "Bidirectional"
        assert set(cs) == {"bridge"} and cs["bridge"]["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert_only_bridge_privileged_or_root(spec)
    finally:
        cluster.kubectl("delete", "node", node, "--ignore-not-found")
        helm.uninstall(release)
    wait_for(lambda: items(cluster, "pods,daemonsets", f"{INSTANCE}={release}", namespace) == [], what="the bridge Pod to be collected", every=0.3)
