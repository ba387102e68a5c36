"""Imports point one way: four layers, each importing only its own and those below; pure
modules never reach the API server, kopf or other packages."""

import ast
from pathlib import Path

import resident_operator

PKG = Path(resident_operator.__file__).parent
SIDE_EFFECTS = {"kubernetes", "kopf", "requests", "resident_operator.kube",
                "resident_operator.owner_client", "resident_operator.handlers"}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = "resident_operator" + ("." + mod if mod else "")
                found |= {f"{mod}.{a.name}" if not node.module else mod for a in node.names}
            else:
                found.add(mod)
    return found


def test_pure_modules_have_no_side_effect_imports():
    for name in sorted(LAYERS["pure"]):
        bad = {m for m in imports(PKG / f"{name}.py")
               if m.split(".")[0] in ("kubernetes", "kopf", "requests") or m in SIDE_EFFECTS}
        assert not bad, f"{name}.py imports {bad}"


# The operator's four layers (docs/operator.md, "Shape of the code"): a module imports only
# modules of its own layer or of a layer below. Every module is placed: a new one must be.
LAYERS = {
    "pure": {"spec", "settings", "naming", "conditions", "children", "delivery", "placement", "pod_template",
             "pod_verdicts", "planning", "transition", "transition_summary", "observe", "source_probes",
             "retry_policy"},
    "effects": {"kube", "child_cache", "owner_client", "context", "model_state", "metrics", "structured_logs"},
    "steps": {"owners", "owner_step", "rollout", "template_roll", "prestage", "companions", "serving",
              "control_policy", "disruption", "source_check", "cleanup", "reconcile"},
    "runtime": {"passes", "driver", "sweep", "leadership", "handlers", "__main__", "__init__"},
}


def test_every_module_sits_in_one_layer_and_imports_only_its_own_or_lower_layers():
    rank = {m: i for i, mods in enumerate(LAYERS.values()) for m in mods}
    names = {path.stem for path in PKG.glob("*.py")}
    assert names == set(rank), f"not placed in a layer: {sorted(names - set(rank))}; " \
                               f"placed but gone: {sorted(set(rank) - names)}"
    upward = []
    for name in sorted(names):
        for m in imports(PKG / f"{name}.py"):
            parts = m.split(".")
            if parts[0] != "resident_operator" or len(parts) < 2 or parts[1] not in rank:
                continue
            if rank[parts[1]] > rank[name]:
                upward.append(f"{name} ({list(LAYERS)[rank[name]]}) imports {parts[1]} "
                              f"({list(LAYERS)[rank[parts[1]]]})")
    assert not upward, upward


def test_operator_imports_no_other_component():
    for path in PKG.glob("*.py"):
        bad = {m for m in imports(path) if m.split(".")[0] in ("csi_bridge", "owner")}
        assert not bad, f"{path.name} imports {bad}"


def test_modules_explain_themselves():
    """Every module says what idea it holds. Its length is not capped: a cap splits ideas
    by length, not by meaning (shared/STYLE.md)."""
    for path in PKG.glob("*.py"):
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"


RETRY_WORDS = ("RETRY", "BACKOFF", "RECHECK", "PROBE", "RESYNC", "RELAPSE")


def _number(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
        and not isinstance(node.value, bool) and node.value > 0


def test_retry_delays_live_in_retry_policy_alone():
    """One module holds retry policy: a number given as a pass's next try (``recheck_in``,
    ``FollowUp(due=...)``, ``TemporaryError(delay=...)``), or a module constant named
    for a retry or backoff, anywhere else fails."""
    found = []
    for path in sorted(PKG.glob("*.py")):
        if path.stem == "retry_policy":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if callee == "recheck_in" and node.args and _number(node.args[0]):
                    found.append(f"{path.name}:{node.lineno} recheck_in({node.args[0].value})")
                found += [f"{path.name}:{node.lineno} {k.arg}={k.value.value}" for k in node.keywords
                          if k.arg in ("delay", "due") and _number(k.value)]
            elif isinstance(node, ast.Assign) and _number(node.value):
                found += [f"{path.name}:{node.lineno} {t.id}" for t in node.targets
                          if isinstance(t, ast.Name) and any(w in t.id for w in RETRY_WORDS)]
    assert not found, f"retry delays outside retry_policy.py: {found}"


def test_one_function_replaces_an_owner():
    """A slot's next incarnation made on purpose (``new_incarnation=True``) is made by
    ``owners.replace_owner`` alone, which also deletes the Pod it replaces."""
    found = []
    for path in sorted(PKG.glob("*.py")):
        tree = ast.parse(path.read_text())
        allowed = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                   and path.stem == "owners" and f.name == "replace_owner" for n in ast.walk(f)}
        found += [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and id(node) not in allowed
                  and any(k.arg == "new_incarnation" and isinstance(k.value, ast.Constant)
                          and k.value.value is True for k in node.keywords)]
    assert not found, f"an owner replaced outside owners.replace_owner: {found}"
