"""``kubectl resident``: a kubectl plugin that shows a ResidentModel the way a human follows it.

``kubectl resident get MODEL [--watch]`` draws the model's owners, their nodes and
revisions, the transition in flight step by step and the conditions; ``kubectl resident
history MODEL`` lists the model's transitions. kubectl finds the plugin as the executable
``kubectl-resident`` on PATH (the ``resident`` package installs it).

Layers import one way: ``cli`` (arguments, exit codes) -> ``access`` (the kubeconfig and the
API server) and ``view`` (pure: a model's dict in, lines of text out). The operator never
imports this package; it only reads what the operator writes into ``status`` and Events.
"""
