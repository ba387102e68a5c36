"""resident_operator: the kopf operator that keeps ResidentModels resident.

Importing the package registers its kopf handlers, so ``kopf run -m resident_operator``
works. The layers import one way: ``handlers`` -> ``driver`` (one loop per model, woken
by watch events) / ``passes`` / ``sweep`` -> ``reconcile``/``rollout``/``owners``/
``cleanup`` (passes with side effects through ``kube`` and ``owner_client``) -> pure
modules (``spec``, ``placement``, ``delivery``, ``transition``, ``planning``, ``observe``,
``conditions``, ``children``, ``naming``).
"""

from . import handlers  # noqa: F401  (registers the kopf handlers)
