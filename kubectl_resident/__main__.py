"""``python -m kubectl_resident``: the same as the ``kubectl-resident`` console script."""

from .cli import run

run()
