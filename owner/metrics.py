"""Prometheus metrics of one owner, in a registry of its own (units in the names).

- ``resident_owner_transition_duration_seconds{strategy,phase}``: stage, apply, verify,
  warmup (cold reloads with warmup on), first_token and total of every transition;
- ``resident_owner_transitions_total{strategy,result}``;
- ``resident_owner_generate_duration_seconds`` and ``resident_owner_first_token_seconds``;
- ``resident_owner_load_duration_seconds{phase}``: read (weights) and compile (graph);
- ``resident_owner_state{state}``: 1 for the current state, 0 for the others.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STATES = ("loading", "ready", "transitioning", "quarantined", "unloaded")
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class OwnerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.transition = Histogram("resident_owner_transition_duration_seconds",
                                    "Duration of each transition phase", ["strategy", "phase"],
                                    buckets=BUCKETS, registry=r)
        self.transitions = Counter("resident_owner_transitions_total", "Transitions by result",
                                   ["strategy", "result"], registry=r)
        self.generate = Histogram("resident_owner_generate_duration_seconds",
                                  "Duration of /v1/generate requests", buckets=BUCKETS, registry=r)
        self.first_token = Histogram("resident_owner_first_token_seconds",
                                     "Time to the first generated token", buckets=BUCKETS, registry=r)
        self.load = Histogram("resident_owner_load_duration_seconds", "Model load phases",
                              ["phase"], buckets=BUCKETS, registry=r)
        self.state = Gauge("resident_owner_state", "1 for the owner's current state", ["state"], registry=r)

    def set_state(self, state: str) -> None:
        for s in STATES:
            self.state.labels(state=s).set(1 if s == state else 0)

    def observe_transition(self, strategy: str, result: str, timings: dict[str, float | None]) -> None:
        self.transitions.labels(strategy=strategy, result=result).inc()
        for phase, value in timings.items():
            if value is not None:
                self.transition.labels(strategy=strategy, phase=phase).observe(value)
