"""Named steps of publish, unpublish and staging at which a test may stop the bridge.

Why this stays in the shipped package: the bridge's crash-safety claims (a restarted
bridge leaks no mount, loses no lease and exposes no partial tree) are shown by killing
the real process at exact steps inside a publish or a staging, and those steps are in the
middle of ``publisher.py`` and ``staging.py`` functions: the only way to stop there is a
call there. This module is the whole production side of that seam, and it does nothing by
itself: :func:`reached` calls the hook given to :func:`install`, and nothing the image runs
installs one (a point then costs one ``is None`` test). It reads no environment variable,
so no setting of a production bridge can make it exit at a point.

The test seam, ``testkit/crash_points.py`` (outside the wheel, so outside the image), runs
the bridge through its own entry point and installs a hook that ends the process at the
named point as if SIGKILLed. The component and cluster tests use it; the e2e layer, which
runs the image, does not.
"""

from __future__ import annotations

from typing import Callable

POINTS = (
    "publish:after-lease",      # lease taken, volume directory not built yet
    "publish:after-volume",     # volume directory built, target not mounted
    "publish:after-bind",       # bind mount made, not yet remounted read-only
    "publish:after-mount",      # read-only mount verified, record not yet 'published'
    "unpublish:after-unmount",  # target unmounted, volume and lease still there
    "stage:after-lease",        # delivery lease taken, revision not linked yet
    "stage:after-link",         # revision linked into the volume, current not moved
)

_hook: Callable[[str], None] | None = None


def install(hook: Callable[[str], None] | None) -> None:
    """Call ``hook(point)`` at every point from now on (None: nothing, the default)."""
    global _hook
    _hook = hook


def reached(point: str) -> None:
    if _hook is not None:
        _hook(point)
