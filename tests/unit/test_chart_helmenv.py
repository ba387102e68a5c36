"""The one place that decides which Python runs Helm's library (charts/helmenv.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from charts import helmenv  # noqa: E402


def test_venv_lives_in_the_resident_cache_keyed_by_version(monkeypatch, tmp_path):
    monkeypatch.setenv("RESIDENT_CACHE", str(tmp_path))
    assert helmenv.venv_dir() == tmp_path / f"helm-venv-{helmenv.HELM_SDKPY_VERSION}"


def test_explicit_python_older_than_312_is_refused(monkeypatch):
    monkeypatch.setenv("RESIDENT_HELM_PYTHON", sys.executable)  # the project's 3.11
    if sys.version_info >= (3, 12):
        pytest.fail("the project venv is expected to be Python 3.11")
    with pytest.raises(helmenv.HelmUnavailable, match="not a runnable Python >= 3.12"):
        helmenv.find_python()


def test_missing_explicit_python_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("RESIDENT_HELM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(helmenv.HelmUnavailable, match="RESIDENT_HELM_PYTHON"):
        helmenv.find_python()


def test_no_candidate_python_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("RESIDENT_HELM_PYTHON", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(helmenv.HelmUnavailable, match="pyenv install 3.12"):
        helmenv.find_python()


def test_helm_failure_names_action_and_kind():
    err = helmenv.HelmFailed("install", "InstallError", "values don't meet the specifications")
    assert str(err) == "helm install failed: InstallError: values don't meet the specifications"
