"""The owner Pod template hash: what rolls owners and what does not."""

from resident_operator.placement import build_owner_pod
from resident_operator.pod_template import TEMPLATE_ANNOTATION, outdated, stamp, template_hash
from resident_operator.settings import OperatorSettings
from resident_operator.spec import parse_spec

A = "sha256:" + "aa" * 32
B = "sha256:" + "bb" * 32
SETTINGS = OperatorSettings(owner_image="resident:dev")


def spec(**over):
    raw = {"bundle": {"source": "file:///m/a", "digest": A}, "replicas": 2}
    raw.update(over)
    return parse_spec(raw)


def h(s, settings=SETTINGS):
    return template_hash("tiny", s, settings)


def test_pod_template_fields_change_the_hash():
    base = h(spec())
    changed = [spec(runtime={"image": "owner:v2"}), spec(runtime={"port": 9000}),
               spec(runtime={"resources": {"limits": {"memory": "1Gi"}}}),
               spec(runtime={"warmup": True, "variants": [{"name": "b1"}]}),
               spec(nodeSelector={"pool": "a"}),
               spec(accelerator="furiosa.ai/rngd", runtime={"backend": "rngd"})]
    hashes = [h(s) for s in changed] + [h(spec(), OperatorSettings(owner_image="resident:v3"))]
    assert base not in hashes and len(set(hashes)) == len(hashes)


def test_revision_replicas_delivery_and_transition_do_not():
    base = h(spec())
    assert h(spec(bundle={"source": "http://h/b", "digest": B})) == base
    assert h(spec(replicas=5)) == base
    assert h(spec(delivery={"mode": "GraphOnly"}, transition={"strategy": "Reload", "maxUnavailable": 2})) == base


def test_pods_carry_the_hash_and_unstamped_pods_count_as_current():
    s = spec()
    pod = stamp(build_owner_pod("tiny", "uid", s, SETTINGS, 1, 2, A, "file:///m/a"), "tiny", s, SETTINGS)
    assert pod["metadata"]["annotations"][TEMPLATE_ANNOTATION] == h(s)
    assert not outdated(pod, h(s))
    assert outdated(pod, h(spec(runtime={"image": "owner:v2"})))
    del pod["metadata"]["annotations"][TEMPLATE_ANNOTATION]
    assert not outdated(pod, h(spec(runtime={"image": "owner:v2"})))


def test_scrape_annotations_name_the_inference_port_and_roll_no_owner():
    s = spec(runtime={"port": 9000})
    scraped = OperatorSettings(owner_image="resident:dev", owner_scrape_annotations=True)
    pod = build_owner_pod("tiny", "uid", s, scraped, 0, 0, A, "file:///m/a")
    http = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}["http"]
    assert {k: v for k, v in pod["metadata"]["annotations"].items() if k.startswith("prometheus.io/")} == {
        "prometheus.io/scrape": "true", "prometheus.io/port": str(http), "prometheus.io/path": "/metrics"}
    plain = build_owner_pod("tiny", "uid", s, SETTINGS, 0, 0, A, "file:///m/a")
    assert not any(k.startswith("prometheus.io/") for k in plain["metadata"]["annotations"])
    assert h(s, scraped) == h(s)    # turning it on does not replace running owners
