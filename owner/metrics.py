"""Prometheus metrics of one owner, in a registry of its own (units in the names).

- ``resident_owner_transition_duration_seconds{strategy,phase}``: stage, apply, verify,
  warmup (cold reloads with warmup on), first_token and total of every transition;
- ``resident_owner_transitions_total{strategy,result}``;
- ``resident_owner_generate_duration_seconds`` and
  ``resident_owner_generate_time_to_first_token_seconds`` (the control API's
  ``/v1/generate``, the operator's smoke test);
- ``resident_owner_load_duration_seconds{phase}``: read (weights) and compile (graph);
- ``resident_owner_state{state}``: 1 for the current state, 0 for the others;
- ``resident_owner_ready``: 1 while ``/readyz`` answers 200.

The inference port's. The counters carry the revision that answered (``none`` when none
did: refused before a revision was chosen), so a switch shows which revision served and
failed; an owner serves few revisions in its life, so these series stay few. The
histograms leave it out: each revision would add a whole set of buckets.

- ``resident_owner_inference_requests_total{revision,code}`` (every answered request);
- ``resident_owner_inference_errors_total{revision,type}`` (error answers by OpenAI error
  type, plus ``stream_error`` for a stream cut short after its first chunk);
- ``resident_owner_generated_tokens_total{revision}``;
- ``resident_owner_time_to_first_token_seconds`` (from the request's arrival, waiting
  included, to its first token);
- ``resident_owner_inference_request_duration_seconds``.
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
        self.first_token = Histogram("resident_owner_generate_time_to_first_token_seconds",
                                     "Time to the first token of /v1/generate requests",
                                     buckets=BUCKETS, registry=r)
        self.load = Histogram("resident_owner_load_duration_seconds", "Model load phases",
                              ["phase"], buckets=BUCKETS, registry=r)
        self.state = Gauge("resident_owner_state", "1 for the owner's current state", ["state"], registry=r)
        self.ready = Gauge("resident_owner_ready", "1 while /readyz answers 200", registry=r)
        self.requests = Counter("resident_owner_inference_requests_total",
                                "Inference requests by the revision that answered and HTTP code",
                                ["revision", "code"], registry=r)
        self.errors = Counter("resident_owner_inference_errors_total", "Inference error answers by type",
                              ["revision", "type"], registry=r)
        self.tokens = Counter("resident_owner_generated_tokens_total", "Tokens generated for requests",
                              ["revision"], registry=r)
        self.ttft = Histogram("resident_owner_time_to_first_token_seconds",
                              "From an inference request's arrival to its first token",
                              buckets=BUCKETS, registry=r)
        self.duration = Histogram("resident_owner_inference_request_duration_seconds",
                                  "Inference request duration", buckets=BUCKETS, registry=r)

    def set_state(self, state: str) -> None:
        for s in STATES:
            self.state.labels(state=s).set(1 if s == state else 0)

    def observe_transition(self, strategy: str, result: str, timings: dict[str, float | None]) -> None:
        self.transitions.labels(strategy=strategy, result=result).inc()
        for phase, value in timings.items():
            if value is not None:
                self.transition.labels(strategy=strategy, phase=phase).observe(value)
