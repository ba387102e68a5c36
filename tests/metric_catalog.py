"""Every Prometheus series the components export, read from their real registries.

Each component keeps its metrics in a registry: the operator and each owner in one of
their own, the bridge in one it is given (the default one in production), and the bundle
store, the sources and the bundle server in the process-wide default registry. This
module builds each the way its component does and lists what they hold, by the name a
scrape shows (counters with ``_total``; histograms by their base name). docs/metrics.md,
the alert rules and the dashboard are checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import prometheus_client


@dataclass(frozen=True)
class Series:
    name: str                      # as scraped: counters end in _total
    type: str                      # counter, gauge or histogram
    labels: tuple[str, ...] | None  # None: a custom collector, labels known only from samples
    component: str


def _registries() -> dict[str, prometheus_client.CollectorRegistry]:
    import bundle.sources.httpserve  # noqa: F401  (registers the bundle server's counters)
    import bundle.sources.metrics  # noqa: F401
    import bundle.store_metrics  # noqa: F401
    from csi_bridge.metrics import BridgeMetrics
    from owner.metrics import OwnerMetrics
    from resident_operator import metrics as operator_metrics

    return {"operator": operator_metrics.REGISTRY, "owner": OwnerMetrics().registry,
            "bridge": BridgeMetrics(prometheus_client.CollectorRegistry()).registry,
            "default": prometheus_client.REGISTRY}


DEFAULT_REGISTRY_COMPONENTS = {"resident_source_": "bridge", "resident_bundle_server_": "bundle server"}


def exported() -> dict[str, Series]:
    """Every ``resident_*`` series, by its scraped name."""
    found: dict[str, Series] = {}
    for component, registry in _registries().items():
        objects = {name: c for c, names in registry._collector_to_names.items() for name in names}
        for family in registry.collect():
            if not family.name.startswith("resident_"):
                continue
            name = family.name + ("_total" if family.type == "counter" else "")
            owner = objects.get(name) or objects.get(family.name)
            labels = tuple(owner._labelnames) if hasattr(owner, "_labelnames") else None
            where = component
            if component == "default":   # the store's series are the bridge's; see the table
                where = next((c for prefix, c in DEFAULT_REGISTRY_COMPONENTS.items()
                              if name.startswith(prefix)), "bridge")
            found[name] = Series(name, family.type, labels, where)
    return found


def scraped_names(series: dict[str, Series]) -> set[str]:
    """Every sample name a scrape can show: histograms add _bucket, _sum and _count."""
    names = set()
    for s in series.values():
        names.add(s.name)
        if s.type == "histogram":
            names |= {s.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names
