"""``resident operator --help`` explains, bad settings fail clearly, metrics carry units."""

import json
import logging
import time

import pytest

from resident_operator import metrics
from resident_operator.__main__ import main
from bundle.jsonlog import JSONLineFormatter
from resident_operator.structured_logs import QuietSuccesses, WithoutKopfSettings


@pytest.fixture(autouse=True)
def keep_root_logging():
    """main() installs its JSON handler on the root logger; give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def test_help_explains_settings(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("RESIDENT_OWNER_IMAGE", "RESIDENT_OWNER_HOST", "--namespace", "--metrics-port", "transitions"):
        assert word in out


def test_bad_setting_exits_2_with_the_variable_named(monkeypatch, capsys):
    monkeypatch.setenv("RESIDENT_OWNER_TIMEOUT_SECONDS", "soon")
    assert main(["--metrics-port", "0"]) == 2
    assert "RESIDENT_OWNER_TIMEOUT_SECONDS" in capsys.readouterr().err


def test_resident_cli_dispatches_to_the_operator(capsys):
    import resident_cli
    with pytest.raises(SystemExit):
        resident_cli.main(["operator", "--help"])
    assert "resident operator" in capsys.readouterr().out


def test_json_log_lines_carry_extra_fields():
    rec = logging.LogRecord("resident.operator", logging.INFO, __file__, 1, "created %s", ("pod",), None)
    rec.model, rec.reason = "ns/m", "OwnerPodCreated"
    doc = json.loads(JSONLineFormatter().format(rec))
    assert (doc["msg"], doc["model"], doc["reason"], doc["level"]) == ("created pod", "ns/m", "OwnerPodCreated", "info")
    rec.settings = object()          # kopf attaches its settings object: not data, left out
    rec.k8s_ref = {"name": "m"}
    assert WithoutKopfSettings().filter(rec) is True
    doc = json.loads(JSONLineFormatter().format(rec))
    assert "settings" not in doc and doc["k8s_ref"] == {"name": "m"}
    quiet = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler 'pod_changed' succeeded.", (), None)
    failed = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, "Handler 'pod_changed' failed.", (), None)
    assert QuietSuccesses().filter(quiet) is False
    assert QuietSuccesses().filter(rec) is True and QuietSuccesses().filter(failed) is True


def test_metric_names_have_units_and_models_by_phase_counts():
    names = {m.name for m in metrics.REGISTRY.collect()}
    assert {"resident_transition_duration_seconds", "resident_operator_reconciles",
            "resident_models"} <= names
    get = metrics.REGISTRY.get_sample_value
    # relative to what in-process operators of earlier tests (cluster layer) left counted
    ready, degraded = (get("resident_models", {"phase": p}) or 0 for p in ("Ready", "Degraded"))
    metrics.set_model_phase("ns/a", "Ready")
    metrics.set_model_phase("ns/b", "Ready")
    metrics.set_model_phase("ns/c", "Degraded")
    assert get("resident_models", {"phase": "Ready"}) == ready + 2
    assert get("resident_models", {"phase": "Degraded"}) == degraded + 1
    metrics.set_model_phase("ns/b", None)
    assert get("resident_models", {"phase": "Ready"}) == ready + 1
    for key in ("ns/a", "ns/c"):
        metrics.set_model_phase(key, None)


def test_per_model_series_name_the_model_and_a_transition_past_its_timeout():
    get = metrics.REGISTRY.get_sample_value
    model = {"namespace": "ns", "model": "m"}
    metrics.set_model_phase("ns/m", "Degraded")
    assert get("resident_model_phase", {**model, "phase": "Degraded"}) == 1
    assert get("resident_model_phase", {**model, "phase": "Ready"}) is None
    metrics.set_transition_deadline("ns/m", time.time() + 60)
    assert get("resident_transition_overdue_seconds", model) is None   # not due yet
    metrics.set_transition_deadline("ns/m", time.time() - 30)
    assert get("resident_transition_overdue_seconds", model) >= 30
    metrics.set_model_phase("ns/m", None)    # the model is gone: so are its series
    assert get("resident_model_phase", {**model, "phase": "Degraded"}) is None
    assert get("resident_transition_overdue_seconds", model) is None


def test_passes_and_scrapes_on_other_threads_never_meet_a_changing_dict():
    """Passes set phases on kopf's threads while the metrics server collects (seen at 3,000
    models: "dictionary changed size during iteration"); the counts stay exact."""
    import sys
    import threading
    get = metrics.REGISTRY.get_sample_value
    ready = get("resident_models", {"phase": "Ready"}) or 0
    errors: list[BaseException] = []
    stop = threading.Event()

    def guarded(work):
        def run():
            try:
                work()
            except BaseException as e:   # noqa: BLE001 - what a thread raised is the result
                errors.append(e)
        return threading.Thread(target=run)

    def passes(worker: int):
        for i in range(3000):
            metrics.set_model_phase(f"race/{worker}-{i}", "Ready" if i % 2 else "Loading")

    def scrapes():
        while not stop.is_set():
            for _ in metrics.REGISTRY.collect():
                pass

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as possible, to make them meet
    try:
        scraper = guarded(scrapes)
        workers = [guarded(lambda w=w: passes(w)) for w in range(3)]
        for t in (scraper, *workers):
            t.start()
        for t in workers:
            t.join()
        stop.set()
        scraper.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert get("resident_models", {"phase": "Ready"}) == ready + 3 * 1500
    for w in range(3):
        for i in range(3000):
            metrics.set_model_phase(f"race/{w}-{i}", None)
    assert get("resident_models", {"phase": "Ready"}) == ready
