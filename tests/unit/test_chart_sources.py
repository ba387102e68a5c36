"""The chart's generated files match their sources: CRDs from crds/, the values schema
from the documented values.yaml; and the generators reject what they cannot represent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from charts import chart_crds, values_schema  # noqa: E402


def strip_template(text: str) -> dict:
    """A generated CRD template without its Helm actions, as the API object it renders."""
    lines = [ln for ln in text.splitlines() if "{{" not in ln and not ln.lstrip().startswith("#")]
    return yaml.safe_load("\n".join(lines))


# -- CRDs ------------------------------------------------------------------------------

def test_chart_crds_are_generated_from_crds_folder():
    assert chart_crds.stale() == [], "run: python -m charts.chart_crds"
    sources = sorted(p.name for p in chart_crds.SOURCE_DIR.glob("*.yaml"))
    assert sources and sorted(p.name for p in chart_crds.TARGET_DIR.glob("*.yaml")) == sources


def test_a_delivery_accepts_every_source_a_model_accepts():
    """The operator copies the model's source into its BundleDelivery: a scheme the model's
    CRD admits and the delivery's refuses fails every transition of such a model (hf://
    did, found by its e2e test)."""
    def source_schema(crd: str, *path: str) -> dict:
        doc = yaml.safe_load((chart_crds.SOURCE_DIR / crd).read_text())
        node = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for key in path:
            node = node["properties"][key]
        return node

    model = source_schema("residentmodels.resident.dev.yaml", "spec", "bundle", "source")
    delivery = source_schema("bundledeliveries.resident.dev.yaml", "spec", "bundle", "source")
    assert delivery["pattern"] == model["pattern"]
    assert delivery["maxLength"] >= model["maxLength"]


def test_chart_crd_carries_the_source_spec_unchanged():
    for source in sorted(chart_crds.SOURCE_DIR.glob("*.yaml")):
        original = yaml.safe_load(source.read_text())
        rendered = strip_template((chart_crds.TARGET_DIR / source.name).read_text())
        assert rendered["spec"] == original["spec"]
        assert rendered["metadata"]["name"] == original["metadata"]["name"]
        assert (rendered["apiVersion"], rendered["kind"]) == (original["apiVersion"], original["kind"])


def test_chart_crd_is_gated_and_keepable():
    text = (chart_crds.TARGET_DIR / "residentmodels.resident.dev.yaml").read_text()
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert body[0] == "{{- if .Values.crds.enabled }}" and body[-1] == "{{- end }}"
    assert "{{- if .Values.crds.keep }}" in text and "helm.sh/resource-policy: keep" in text


def test_stale_detects_an_edited_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_crds, "TARGET_DIR", tmp_path)
    assert set(chart_crds.stale()) == set(chart_crds.expected())  # all missing
    chart_crds.write()
    assert chart_crds.stale() == []
    victim = next(tmp_path.glob("*.yaml"))
    victim.write_text(victim.read_text().replace("served: true", "served: false"))
    (tmp_path / "extra.yaml").write_text("kind: Leftover\n")
    assert chart_crds.stale() == sorted([victim.name, "extra.yaml"])
    chart_crds.write()
    assert chart_crds.stale() == [] and not (tmp_path / "extra.yaml").exists()


@pytest.mark.parametrize("text, message", [
    ("kind: ConfigMap\nmetadata: {name: x}\n", "expected one CustomResourceDefinition"),
    ("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
     "metadata: {name: a.b, labels: {x: y}}\nspec: {}\n", "metadata must hold only a name"),
    ("kind: [unclosed\n", "not valid YAML"),
])
def test_bad_crd_source_is_refused_with_a_reason(tmp_path, text, message):
    source = tmp_path / "bad.yaml"
    source.write_text(text)
    with pytest.raises(chart_crds.CrdSourceError, match=message):
        chart_crds.render(source)


def test_template_braces_in_a_crd_are_escaped(tmp_path):
    source = tmp_path / "x.yaml"
    source.write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
                      "metadata: {name: xs.example.dev}\nspec: {description: 'use {{ name }}'}\n")
    out = chart_crds.render(source)
    assert '{{ "{{" }} name }}' in out and "use {{ name" not in out


# -- values.yaml and values.schema.json -----------------------------------------------

def test_values_schema_is_generated_from_values_yaml():
    want = values_schema.render(values_schema.build())
    assert values_schema.SCHEMA.read_text() == want, "run: python -m charts.values_schema"


def leaves(values: dict, prefix: str = ""):
    for key, value in values.items():
        path = f"{prefix}{key}"
        yield path, value
        if isinstance(value, dict):
            yield from leaves(value, path + ".")


def schema_node(schema: dict, path: str) -> dict:
    node = schema
    for key in path.split("."):
        node = node["properties"][key]
    return node


def test_every_value_is_documented_and_typed_in_the_schema():
    text = values_schema.VALUES.read_text()
    values = yaml.safe_load(text)
    docs = values_schema.comments(text, values)
    schema = json.loads(values_schema.SCHEMA.read_text())
    paths = dict(leaves(values))
    assert set(docs) == set(paths)
    for path, value in paths.items():
        node = schema_node(schema, path)
        assert node["description"] == docs[path] and len(docs[path]) > 10, path
        if not isinstance(value, dict):
            assert node["default"] == value, path
    # the schema names no key that values.yaml lacks
    def schema_paths(node, prefix=""):
        for key, child in (node.get("properties") or {}).items():
            yield prefix + key
            if child.get("type") == "object":
                yield from schema_paths(child, prefix + key + ".")
    assert set(schema_paths(schema)) == set(paths)


def test_component_objects_are_closed_and_user_ids_non_root():
    schema = json.loads(values_schema.SCHEMA.read_text())
    for path in ("", "operator", "bridge", "bridge.registration", "crds", "image"):
        node = schema_node(schema, path) if path else schema
        assert node["additionalProperties"] is False, path
    for path in ("operator.runAsUser", "operator.runAsGroup", "bridge.sidecarUser", "bridge.socketGroup"):
        assert schema_node(schema, path)["minimum"] == 1, path
    assert schema_node(schema, "bridge.registration.mode")["enum"] == ["builtin", "sidecar"]


def test_undocumented_key_is_refused():
    text = "# -- documented\na: 1\nb: 2\n"
    with pytest.raises(values_schema.ValuesDocError, match="line 3: key 'b' has no '# --' comment"):
        values_schema.build(text)


def test_nested_undocumented_key_is_refused():
    text = "# -- the parent\nparent:\n  # -- fine\n  child: x\n  other: y\n"
    with pytest.raises(values_schema.ValuesDocError, match="'parent.other'"):
        values_schema.build(text)


def test_constraint_for_a_missing_key_is_refused():
    with pytest.raises(values_schema.ValuesDocError, match="constraints name keys"):
        values_schema.build("# -- only this\nimage: {}\n")


def test_list_items_are_values_not_documented_keys():
    text = values_schema.VALUES.read_text()
    values = yaml.safe_load(text)
    docs = values_schema.comments(text, values)
    assert "bridge.tolerations" in docs and not any(k.endswith(".operator") for k in docs)
