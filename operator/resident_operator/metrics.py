"""Prometheus metrics of the operator (units in the names).

- ``resident_operator_reconciles_total{result}``: reconcile passes by outcome
  (``ok``, ``waiting``, ``invalid``, ``error``).
- ``resident_operator_reconcile_errors_total{reason}``: failed passes by exception class.
- ``resident_transition_duration_seconds{strategy,path,phase}``: per finished owner
  transition, ``phase`` is ``deliver``, ``apply`` or ``total``.
- ``resident_transitions_total{result}``: finished transitions.
- ``resident_models{phase}``: models by phase, as last observed by this operator.
- ``resident_operator_wakes_total{cause}``: requests for a model's pass, by what asked
  (``model``, ``pod``, ``secret``, ``delivery``, ``service``, ``budget``,
  ``control-policy``, ``owner``, ``resync``, ``sweep``).
- ``resident_operator_pass_duration_seconds``: wall time of one pass.
- ``resident_operator_status_conflicts_total``: conditional status writes that met a newer
  model (409) and were rebased onto it (``model_state.py``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
TRANSITIONS = Counter("resident_transitions_total", "Finished transitions by result.",
                      ["result"], registry=REGISTRY)
WAKES = Counter("resident_operator_wakes_total", "Requests for a model's pass, by cause.",
                ["cause"], registry=REGISTRY)
SOURCE_PROBES = Counter("resident_operator_source_probes_total",
                        "Probes of sources that were down, by result (answered or down); one "
                        "probe serves every model waiting on its source.", ["result"], registry=REGISTRY)
PASS_SECONDS = Histogram("resident_operator_pass_duration_seconds", "Wall time of one pass.",
                         registry=REGISTRY,
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
STATUS_CONFLICTS = Counter("resident_operator_status_conflicts_total",
                           "Conditional status writes that met a newer model (409) and were "
                           "rebased onto it.", registry=REGISTRY)
MODELS = Gauge("resident_models", "ResidentModels by phase (this operator's view).", ["phase"],
               registry=REGISTRY)
PHASES = ("Pending", "Delivering", "Loading", "Ready", "Transitioning", "Degraded", "Terminating")

_model_phase: dict[str, str] = {}


def set_model_phase(key: str, phase: str | None) -> None:
    """Remember ``key``'s phase (None: forget the model) and refresh the gauge."""
    if phase is None:
        _model_phase.pop(key, None)
    else:
        _model_phase[key] = phase
    for p in set(PHASES) | set(_model_phase.values()):
        MODELS.labels(phase=p).set(sum(1 for v in _model_phase.values() if v == p))
