"""Owner Pods meet the Pod Security Standards' ``restricted`` profile, unless the
installation asks for host networking or a root owner image.

``restricted_violations`` is the profile's checks for a Linux Pod, as the Pod Security
Standards page lists them (baseline, then restricted), written out here so the template is
checked without a cluster. tests/cluster/test_pod_security.py lets the API server's own
Pod Security Admission judge the same Pods.
"""

import pytest

from resident_operator.placement import build_owner_pod
from resident_operator.pod_template import stamp
from resident_operator.settings import OperatorSettings
from resident_operator.spec import parse_spec

DIGEST = "sha256:" + "ab" * 32
SETTINGS = OperatorSettings(owner_image="resident:dev")
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def _effective(pod_sc: dict, sc: dict, key: str):
    return sc[key] if sc.get(key) is not None else pod_sc.get(key)


def restricted_violations(pod: dict) -> list[str]:
    """What keeps ``pod`` out of a namespace that enforces ``restricted``."""
    spec = pod["spec"]
    pod_sc = spec.get("securityContext") or {}
    out = [f"{k}: true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {', '.join(sorted(kinds))}")
    out += [f"sysctl {s['name']}" for s in pod_sc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    if (pod_sc.get("seLinuxOptions") or {}).get("user") or (pod_sc.get("seLinuxOptions") or {}).get("role"):
        out.append("pod seLinuxOptions user/role")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for c in spec.get("containers", []) + spec.get("initContainers", []) + spec.get("ephemeralContainers", []):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
        if _effective(pod_sc, sc, "runAsNonRoot") is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if _effective(pod_sc, sc, "runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (_effective(pod_sc, sc, "seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp or 'unset'}")
        if (_effective(pod_sc, sc, "appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: appArmorProfile Unconfined")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{name}: procMount {sc['procMount']}")
        if (sc.get("seLinuxOptions") or {}).get("user") or (sc.get("seLinuxOptions") or {}).get("role"):
            out.append(f"{name}: seLinuxOptions user/role")
        out += [f"{name}: hostPort {p['hostPort']}" for p in c.get("ports") or [] if p.get("hostPort")]
    return out


def owner_pod(settings: OperatorSettings = SETTINGS, **spec_over) -> dict:
    raw = {"bundle": {"source": "file:///srv/bundles/tiny", "digest": DIGEST}}
    raw.update(spec_over)
    spec = parse_spec(raw)
    pod = build_owner_pod("tiny", "uid-1", spec, settings, 0, 0, DIGEST, raw["bundle"]["source"])
    return stamp(pod, "tiny", spec, settings)


@pytest.mark.parametrize("spec_over", [
    {},
    {"accelerator": "furiosa.ai/rngd", "runtime": {"backend": "rngd", "warmup": True,
                                                   "variants": [{"name": "short"}]}},
    {"serving": {"apiKeySecret": "keys"}, "runtime": {"resources": {"limits": {"memory": "2Gi"}}},
     "tolerations": [{"operator": "Exists"}]},
], ids=["defaults", "vendor card", "api key"])
def test_owner_pods_meet_restricted(spec_over):
    assert restricted_violations(owner_pod(**spec_over)) == []


def test_the_bundle_reaches_the_owner_by_a_csi_inline_volume_restricted_allows():
    volumes = {v["name"]: v for v in owner_pod(serving={"apiKeySecret": "keys"})["spec"]["volumes"]}
    assert {k for v in volumes.values() for k in v if k != "name"} == {"csi", "secret", "emptyDir"}


def test_host_networking_and_root_owners_do_not():
    host = OperatorSettings(owner_image="resident:dev", owner_host_network=True)
    assert restricted_violations(owner_pod(host)) == ["hostNetwork: true"]
    root = OperatorSettings(owner_image="resident:dev", owner_run_as_non_root=False)
    assert restricted_violations(owner_pod(root)) == ["owner: runAsNonRoot is not true"]


def test_the_check_sees_what_restricted_forbids():
    pod = owner_pod()
    container = pod["spec"]["containers"][0]
    container["securityContext"].update(privileged=True, allowPrivilegeEscalation=True,
                                        capabilities={"add": ["SYS_ADMIN"]})
    container["ports"][0]["hostPort"] = 8080
    pod["spec"]["volumes"].append({"name": "store", "hostPath": {"path": "/var/lib/resident"}})
    pod["spec"]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    found = restricted_violations(pod)
    for needle in ("privileged", "allowPrivilegeEscalation", "drop ALL", "adds capabilities",
                   "hostPort 8080", "volume store: hostPath", "seccompProfile Unconfined"):
        assert any(needle in f for f in found), (needle, found)
