"""The ``resident`` command: one entry point, one subcommand per component.

Subcommands are imported lazily so that, for example, ``resident bundle`` does not load
kopf and ``resident owner`` does not load gRPC.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "bundle": ("bundle.cli", "build, inspect, verify, diff and push model bundles"),
    "bridge": ("csi_bridge.__main__", "run the CSI node plugin that delivers bundles"),
    "owner": ("owner.__main__", "run the in-Pod resident runtime for one card"),
    "operator": ("resident_operator.__main__", "run the ResidentModel operator (kopf)"),
}


def usage() -> str:
    lines = ["usage: resident <command> [options]", "", "commands:"]
    lines += [f"  {name:<10}{help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'resident <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"resident: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
