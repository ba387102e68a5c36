"""Cluster-layer fixtures: components under test run as the chart's own ServiceAccounts.

``chart_accounts`` installs the chart's RBAC once per session (tests/cluster/chart_accounts.py).
Every test that uses the session's control plane then starts the operator
(conftest_operator's ``running_operator``, ``operator_process``, ``Supervised``) and the
real bridge (``PlayedNode(real_bridge=True)``, the bridge tests) with those accounts'
kubeconfigs, never with the admin one, and the operator with the identity settings the
chart's Deployment gives it (so it creates each model's NetworkPolicy, as installed by
default); the test itself acts as admin (it plays the user and kubelet).
"""

from __future__ import annotations

import pytest

import conftest_operator
from chart_accounts import ChartAccounts, install


@pytest.fixture(scope="session")
def chart_accounts(cluster) -> ChartAccounts:
    return install(cluster)


@pytest.fixture(autouse=True)
def components_run_as_the_chart(request, monkeypatch):
    if "cluster" not in request.fixturenames:
        return  # e.g. the fresh-cluster chart tests, which start their own control plane
    accounts = request.getfixturevalue("chart_accounts")
    monkeypatch.setitem(conftest_operator.OPERATOR_ENV, "KUBECONFIG", accounts.operator)
    for key, value in accounts.operator_identity.items():   # who the operator is, as the chart says
        monkeypatch.setitem(conftest_operator.OPERATOR_ENV, key, value)
    monkeypatch.setattr(conftest_operator, "BRIDGE_KUBECONFIG", accounts.bridge)
