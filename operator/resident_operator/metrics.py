"""Prometheus metrics of the operator (units in the names).

- ``resident_operator_reconciles_total{result}``: reconcile passes by outcome
  (``ok``, ``waiting``, ``invalid``, ``error``).
- ``resident_operator_reconcile_errors_total{reason}``: failed passes by exception class.
- ``resident_transition_duration_seconds{strategy,path,phase}``: per finished owner
  transition, ``phase`` is ``deliver``, ``apply`` or ``total``.
- ``resident_transitions_total{path,strategy,result}``: finished transitions.
- ``resident_models{phase}``: models by phase, as last observed by this operator.
- ``resident_model_phase{namespace,model,phase}``: 1 per model, labelled with its phase,
  so an alert can name the model (one series per model: models are few and long-lived).
- ``resident_transition_overdue_seconds{namespace,model}``: how long a running
  transition's slowest owner step is past ``spec.transition.timeoutSeconds``, computed
  when scraped from the deadline the last pass saw; present only while one is overdue. The
  operator fails a step at its timeout, so a series here means its passes stopped.
- ``resident_owners_unresponsive``: owners marked OwnerUnresponsive now
  (``owner_client.py``).
- ``resident_operator_wakes_total{cause}``: requests for a model's pass, by what asked
  (``model``, ``pod``, ``secret``, ``delivery``, ``service``, ``budget``,
  ``control-policy``, ``mount`` (a FailedMount Event), ``owner``, ``resync``, ``sweep``).
- ``resident_operator_pass_duration_seconds``: wall time of one pass.
- ``resident_operator_child_reads_total{kind,source}``: a pass's reads of a model's owner
  Pods or BundleDeliveries, from the watch ``cache`` or the ``api`` server
  (``child_cache.py`` says when it must be the API server).
- ``resident_operator_model_reads_total{source}``: a pass's reads of its model, from the
  watch ``cache`` or the ``api`` server (a safety resync's, or the cache has none).
- ``resident_operator_status_conflicts_total``: conditional status writes that met a newer
  model (409) and were rebased onto it (``model_state.py``).
"""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

REGISTRY = CollectorRegistry(auto_describe=True)
RECONCILES = Counter("resident_operator_reconciles_total", "Reconcile passes by result.",
                     ["result"], registry=REGISTRY)
RECONCILE_ERRORS = Counter("resident_operator_reconcile_errors_total",
                           "Reconcile passes that raised, by exception class.", ["reason"],
                           registry=REGISTRY)
TRANSITION_SECONDS = Histogram(
    "resident_transition_duration_seconds", "Owner transition durations by phase.",
    ["strategy", "path", "phase"], registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
TRANSITIONS = Counter("resident_transitions_total", "Finished transitions by path, strategy and result.",
                      ["path", "strategy", "result"], registry=REGISTRY)
WAKES = Counter("resident_operator_wakes_total", "Requests for a model's pass, by cause.",
                ["cause"], registry=REGISTRY)
SOURCE_PROBES = Counter("resident_operator_source_probes_total",
                        "Probes of sources that were down, by result (answered or down); one "
                        "probe serves every model waiting on its source.", ["result"], registry=REGISTRY)
PASS_SECONDS = Histogram("resident_operator_pass_duration_seconds", "Wall time of one pass.",
                         registry=REGISTRY,
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
CHILD_READS = Counter("resident_operator_child_reads_total",
                      "A pass's reads of a model's owner Pods or BundleDeliveries, by kind and "
                      "source: the watch cache, or a LIST from the API server (child_cache.py).",
                      ["kind", "source"], registry=REGISTRY)
MODEL_READS = Counter("resident_operator_model_reads_total",
                      "A pass's reads of its model, by source: the watch cache, or a GET from "
                      "the API server (child_cache.py).", ["source"], registry=REGISTRY)
STATUS_CONFLICTS = Counter("resident_operator_status_conflicts_total",
                           "Conditional status writes that met a newer model (409) and were "
                           "rebased onto it.", registry=REGISTRY)
MODELS = Gauge("resident_models", "ResidentModels by phase (this operator's view).", ["phase"],
               registry=REGISTRY)
# Every path, strategy and result starts at 0, so the first failure is an increase that
# rate() and increase() see (a series born at 1 has no earlier sample to rise from).
for _path in ("GraphOnly", "WholeBundle"):
    for _strategy in ("InPlace", "Reload"):
        for _result in ("succeeded", "failed"):
            TRANSITIONS.labels(path=_path, strategy=_strategy, result=_result)
OWNERS_UNRESPONSIVE = Gauge("resident_owners_unresponsive",
                            "Owners marked OwnerUnresponsive (no answer within the call timeout).",
                            registry=REGISTRY)
PHASES = ("Pending", "Delivering", "Loading", "Ready", "Transitioning", "Degraded", "Terminating")

# Passes run on kopf's threads and the scrape on the metrics server's: every read and write
# of the per-model memory below holds this lock (at 3,000 models a scrape met a pass's
# write: "dictionary changed size during iteration").
_lock = threading.Lock()
_model_phase: dict[str, str] = {}
_phase_count: collections.Counter[str] = collections.Counter()
_transition_deadline: dict[str, float] = {}   # "namespace/name" -> wall-clock deadline
for _phase in PHASES:
    MODELS.labels(phase=_phase).set(0)


def set_model_phase(key: str, phase: str | None) -> None:
    """Remember ``key``'s phase (None: forget the model) and move it between the gauge's
    counts: O(1), whatever the number of models."""
    with _lock:
        old = _model_phase.pop(key, None) if phase is None else _model_phase.get(key)
        if phase is None:
            _transition_deadline.pop(key, None)
        else:
            _model_phase[key] = phase
        for p, step in ((old, -1), (phase, +1)):
            if p is not None and old != phase:
                _phase_count[p] += step
                MODELS.labels(phase=p).set(_phase_count[p])


def set_transition_deadline(key: str, deadline: float | None) -> None:
    """The wall-clock time by which ``key``'s running transition must move on (the earliest
    of its running owners' step timeouts); None: no transition runs."""
    with _lock:
        if deadline is None:
            _transition_deadline.pop(key, None)
        else:
            _transition_deadline[key] = deadline


class _PerModel:
    """The per-model series, built from this operator's memory when scraped."""

    def __init__(self, clock=time.time) -> None:
        self.clock = clock

    def describe(self):
        return []   # no samples at registration: the families are built when collected

    def collect(self):
        phase = GaugeMetricFamily("resident_model_phase", "1 per ResidentModel, with its phase "
                                  "(this operator's view).", labels=["namespace", "model", "phase"])
        with _lock:
            phases, deadlines = sorted(_model_phase.items()), sorted(_transition_deadline.items())
        for key, p in phases:
            phase.add_metric([*key.split("/", 1), p], 1)
        overdue = GaugeMetricFamily("resident_transition_overdue_seconds",
                                    "Seconds a running transition is past its step timeout.",
                                    labels=["namespace", "model"])
        now = self.clock()
        for key, deadline in deadlines:
            if now > deadline:
                overdue.add_metric(key.split("/", 1), now - deadline)
        yield phase
        yield overdue


REGISTRY.register(_PerModel())
