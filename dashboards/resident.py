"""The Resident Grafana dashboard, built as code with grafana-foundation-sdk.

What a platform team looks at: how many models are in which phase; transitions by path
and strategy, how often they fail and how long they take; how many bytes the bridges
fetched against how many they reused from what the nodes already held; how full each
node's store is against its GC watermark and its disk; and whether serving failed while
a model switched revisions.

Queries select the job names the chart's monitors set (``resident-operator``,
``resident-bridge``, ``resident-owner``; docs/metrics.md) and read only series listed
there (a unit test checks both). ``python -m dashboards.resident`` writes the JSON into
the chart (``charts/resident/files/dashboards/resident.json``), which the ConfigMap
template embeds; the test regenerates it and fails when the file differs.

This folder is not a package the image installs (pyproject.toml lists those): the
dashboard is an artifact of the chart, built on a development machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (GraphDrawStyle, LegendDisplayMode, LegendPlacement,
                                                  StackingMode)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUTPUT = Path(__file__).resolve().parents[1] / "charts" / "resident" / "files" / "dashboards" / "resident.json"
UID = "resident-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
OPERATOR, BRIDGE, OWNER = 'job="resident-operator"', 'job="resident-bridge"', 'job="resident-owner"'


def query(expr: str, legend: str, ref: str) -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def legend() -> VizLegendOptions:
    return (VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.RIGHT).calcs(["lastNotNull", "max"]))


def timeseries(title: str, description: str, unit: str, *targets: Dataquery,
               stacked: bool = False, bars: bool = False, width: int = 12) -> Timeseries:
    panel = (Timeseries().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .span(width).height(8).legend(legend()).min(0))
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(30)
    if bars:
        panel = panel.draw_style(GraphDrawStyle.BARS).fill_opacity(60)
    for t in targets:
        panel = panel.with_target(t)
    return panel


def models_row(d: Dashboard) -> Dashboard:
    return (d.with_row(Row("Models"))
            .with_panel(Stat().title("Models by phase").datasource(DATASOURCE).span(8).height(6)
                        .description("ResidentModels in each phase, as the operator last saw them.")
                        .with_target(query(f"max by (phase) (resident_models{{{OPERATOR}}})", "{{phase}}", "A")))
            .with_panel(timeseries(
                "Models by phase over time", "The same, over time: Degraded or Transitioning models "
                "that stay are what the alerts ResidentModelDegraded and ResidentTransitionStuck "
                "report.", "short",
                query(f"max by (phase) (resident_models{{{OPERATOR}}})", "{{phase}}", "A"),
                stacked=True, width=16)))


def transitions_row(d: Dashboard) -> Dashboard:
    by = "path, strategy"
    return (d.with_row(Row("Transitions"))
            .with_panel(timeseries(
                "Transitions by path and strategy", "Finished transitions per interval, by delivery "
                "path (GraphOnly, WholeBundle), owner strategy (InPlace, Reload) and result.", "short",
                query(f"sum by ({by}, result) (increase(resident_transitions_total{{{OPERATOR}}}[$__rate_interval]))",
                      "{{path}} {{strategy}} {{result}}", "A"),
                stacked=True, bars=True))
            .with_panel(timeseries(
                "Transition duration (p50, p95)", "Per owner, from the start of its step to done, by "
                "path and strategy.", "s",
                query(f"histogram_quantile(0.5, sum by ({by}, le) (rate(resident_transition_duration_seconds_bucket"
                      f"{{{OPERATOR},phase=\"total\"}}[$__rate_interval])))", "p50 {{path}} {{strategy}}", "A"),
                query(f"histogram_quantile(0.95, sum by ({by}, le) (rate(resident_transition_duration_seconds_bucket"
                      f"{{{OPERATOR},phase=\"total\"}}[$__rate_interval])))", "p95 {{path}} {{strategy}}", "B")))
            .with_panel(timeseries(
                "Transition phases (p95)", "Where a transition's time goes: deliver (the bridge "
                "stages the revision) and apply (the owner switches), by path and strategy.", "s",
                query(f"histogram_quantile(0.95, sum by ({by}, phase, le) (rate("
                      f"resident_transition_duration_seconds_bucket{{{OPERATOR},phase!=\"total\"}}[$__rate_interval])))",
                      "{{phase}} {{path}} {{strategy}}", "A"), width=24)))


def delivery_row(d: Dashboard) -> Dashboard:
    return (d.with_row(Row("Delivery and node stores"))
            .with_panel(timeseries(
                "Bytes fetched against reused", "What the bridges' materializations read from sources "
                "(fetched) and took from content the node already held (reused: hardlinks, reflinks, "
                "chunks), per second over every node.", "Bps",
                query(f"sum by (kind) (rate(resident_delivery_bytes_total{{{BRIDGE},kind=~\"fetched|reused\"}}"
                      "[$__rate_interval]))", "{{kind}}", "A")))
            .with_panel(Stat().title("Bytes fetched and reused in the time range").datasource(DATASOURCE)
                        .span(12).height(8).unit("bytes")
                        .description("Totals over the dashboard's time range, every node.")
                        .with_target(query(f"sum by (kind) (increase(resident_delivery_bytes_total{{{BRIDGE},"
                                           "kind=~\"fetched|reused\"}[$__range]))", "{{kind}}", "A")))
            .with_panel(timeseries(
                "Store usage per node", "Content each node store holds, its GC high watermark (GC runs "
                "above it; ResidentStoreAboveHighWatermark when it cannot get below) and the size of "
                "its filesystem.", "bytes",
                query(f"max by (node) (resident_store_bytes{{{BRIDGE}}})", "{{node}} held", "A"),
                query(f"max by (node) (resident_store_gc_high_water_bytes{{{BRIDGE}}})", "{{node}} high watermark", "B"),
                query(f"max by (node) (resident_store_capacity_bytes{{{BRIDGE}}})", "{{node}} filesystem", "C"),
                width=24)))


def serving_row(d: Dashboard) -> Dashboard:
    return (d.with_row(Row("Serving during switches"))
            .with_panel(timeseries(
                "Inference errors by revision", "Error answers of the owners' inference ports per "
                "second, by model, the revision that answered (none: refused before one was chosen, "
                "e.g. 503 during a one-replica reload) and OpenAI error type; with the models "
                "transitioning, so errors during a switch stand out.", "reqps",
                query(f"sum by (model, revision, type) (rate(resident_owner_inference_errors_total{{{OWNER}}}"
                      "[$__rate_interval]))", "{{model}} {{revision}} {{type}}", "A"),
                query(f"max(resident_models{{{OPERATOR},phase=\"Transitioning\"}})", "models transitioning", "B")))
            .with_panel(timeseries(
                "Inference requests by revision", "Answered requests per second by model and the "
                "revision that answered: a switch shows as one revision's traffic handing over to the "
                "next.", "reqps",
                query(f"sum by (model, revision) (rate(resident_owner_inference_requests_total{{{OWNER}}}"
                      "[$__rate_interval]))", "{{model}} {{revision}}", "A"), stacked=True))
            .with_panel(timeseries(
                "Time to first token (p95)", "From an inference request's arrival, waiting behind an "
                "apply included, to its first token, by model.", "s",
                query(f"histogram_quantile(0.95, sum by (model, le) (rate("
                      f"resident_owner_time_to_first_token_seconds_bucket{{{OWNER}}}[$__rate_interval])))",
                      "{{model}}", "A"), width=24)))


def build() -> Dashboard:
    d = (Dashboard("Resident").uid(UID).tags(["resident"]).editable().refresh("30s")
         .time("now-3h", "now").timezone("browser")
         .description("Models, transitions, delivery, node stores and serving of Resident "
                      "(generated by dashboards/resident.py; docs/metrics.md)")
         .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for row in (models_row, transitions_row, delivery_row, serving_row):
        d = row(d)
    return d


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m dashboards.resident [--check]``: write the JSON, or fail if it is stale."""
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv[:1] == ["--check"]:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python -m dashboards.resident", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
