"""Named crash points, so tests can kill the bridge at an exact step of its work.

When the environment variable ``RESIDENT_BRIDGE_CRASH_AT`` names a point, the process
exits at once (``os._exit``, no cleanup, as if SIGKILLed) when it reaches it. Unset, a
point costs one dictionary lookup. The component tests use it to show that a restarted
bridge leaks no mount, loses no lease and exposes no partial tree; nothing else sets it.
"""

from __future__ import annotations

import os
import sys

CRASH_ENV = "RESIDENT_BRIDGE_CRASH_AT"
EXIT_CODE = 86

POINTS = (
    "publish:after-lease",      # lease taken, volume directory not built yet
    "publish:after-volume",     # volume directory built, target not mounted
    "publish:after-bind",       # bind mount made, not yet remounted read-only
    "publish:after-mount",      # read-only mount verified, record not yet 'published'
    "unpublish:after-unmount",  # target unmounted, volume and lease still there
    "stage:after-lease",        # delivery lease taken, revision not linked yet
    "stage:after-link",         # revision linked into the volume, current not moved
)


def point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        sys.stderr.write(f"crash point {name} reached: exiting\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
