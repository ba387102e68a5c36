"""The bridge with one crash point armed: ``python -m testkit.crash_points <bridge args>``.

When ``RESIDENT_BRIDGE_CRASH_AT`` names one of :data:`csi_bridge.checkpoints.POINTS`, the
process exits at once (``os._exit``, no cleanup, as if SIGKILLed) with :data:`EXIT_CODE`
when it reaches that point; then it runs the bridge's own ``main`` with the arguments
given. :class:`testkit.bridge.BridgeProcess` starts the bridge this way when a test asks
for a crash (``start(crash_at=...)``). The production bridge (``resident bridge``,
``python -m csi_bridge``) never installs this hook: see ``csi_bridge/checkpoints.py``.
"""

from __future__ import annotations

import os
import sys

from csi_bridge import checkpoints

CRASH_ENV = "RESIDENT_BRIDGE_CRASH_AT"
EXIT_CODE = 86
POINTS = checkpoints.POINTS


def arm(point: str) -> None:
    """Exit the process when it reaches ``point``."""
    if point not in POINTS:
        raise ValueError(f"{point!r} is not a crash point: {', '.join(POINTS)}")

    def crash(reached: str) -> None:
        if reached == point:
            sys.stderr.write(f"crash point {reached} reached: exiting\n")
            sys.stderr.flush()
            os._exit(EXIT_CODE)

    checkpoints.install(crash)


def main(argv: list[str] | None = None) -> int:
    point = os.environ.get(CRASH_ENV)
    if point:
        arm(point)
    from csi_bridge.__main__ import main as bridge_main
    return bridge_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
