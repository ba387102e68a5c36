"""One Helm action, run inside the helm venv (see :mod:`charts.helmenv`).

Reads one JSON request on stdin: ``{action, namespace, kubeconfig, release, chart,
values, options}``; calls Helm's Go library through helm-sdkpy; prints one JSON line:
``{"ok": true, "result": ...}`` or ``{"ok": false, "kind": <exception class>, "error": ...}``.
It imports nothing from the project, so it runs on the venv's own Python.

Defaults differ from helm-sdkpy's on purpose: ``wait`` is off, because the local control
plane has no kubelet and a DaemonSet there never becomes ready; callers can turn it on.
"""

import asyncio
import json
import sys


def release(r: dict) -> dict:
    """The parts of a release the callers use (the full one carries the whole chart)."""
    info = r.get("info") or {}
    return {"name": r.get("name"), "namespace": r.get("namespace"), "version": r.get("version"),
            "status": info.get("status"), "description": info.get("description"),
            "notes": info.get("notes", ""), "manifest": r.get("manifest", ""),
            "config": r.get("config") or {}}


async def perform(req: dict):
    import helm_sdkpy as helm

    config = helm.Configuration(namespace=req.get("namespace") or "default",
                                kubeconfig=req.get("kubeconfig") or None)
    action = req["action"]
    options = {"wait": False, "timeout": 120, **(req.get("options") or {})}
    if action == "lint":
        return await helm.Lint(config).run(req["chart"])
    if action == "install":
        return release(await helm.Install(config).run(
            req["release"], req["chart"], values=req.get("values") or None, **options))
    if action == "upgrade":
        return release(await helm.Upgrade(config).run(
            req["release"], req["chart"], values=req.get("values") or None, **options))
    if action == "uninstall":
        return await helm.Uninstall(config).run(req["release"], wait=options["wait"],
                                                timeout=options["timeout"])
    if action == "status":
        return release(await helm.Status(config).run(req["release"]))
    if action == "list":
        return await helm.List(config).run(all=True)
    if action == "version":
        return helm.get_version()
    raise ValueError(f"unknown helm action {action!r}")


def main() -> int:
    try:
        result = asyncio.run(perform(json.loads(sys.stdin.read())))
        answer = {"ok": True, "result": result}
    except Exception as e:  # reported to the caller as data; the caller raises
        answer = {"ok": False, "kind": type(e).__name__, "error": str(e)}
    sys.stdout.write("\n" + json.dumps(answer, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
