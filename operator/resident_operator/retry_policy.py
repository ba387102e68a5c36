"""How long the operator waits before it tries again: every retry delay in one place.

Pure (no I/O, no clock of its own). A pass never sleeps: it ends and asks for its next
pass after one of these (``FollowUp.recheck_in`` or ``kopf.TemporaryError(delay=...)``),
and any event wakes the model sooner. The layering test fails a numeric retry delay
written anywhere else.
"""

from __future__ import annotations

# -- a pass that could not finish ------------------------------------------------------
ERROR_SECONDS = 5.0              # it raised (the model shows Degraded meanwhile)
BLOCKED_SECONDS = 10.0           # a transition could not start for a reason other than its source
OWNER_STATE_SECONDS = 1.0        # an owner's state, without a transition to wait on
MOUNT_RECHECK_SECONDS = 3.0      # an owner Pod waits for its volume and its Events are not watched
BUDGET_RESYNC_SECONDS = 10.0     # a PodDisruptionBudget the disruption controller did not compute
NAME_HELD_SECONDS = 10.0         # a child's name is held by an object that is not the model's
SLOT_NAMES_TAKEN_SECONDS = 5.0   # every name of an owner slot is taken (Pods still going away)

# -- status writes, deletion and stopping --------------------------------------------------
SUPERSEDED_SECONDS = 0.5         # another writer moved the model's progress: start again fresh
STATUS_SECONDS = 1.0             # the status write gave up after conflicts, or the model went
DELETE_SECONDS = 1.0             # a deletion waits for a pass to end or its children to go
STOPPING_SECONDS = 1.0           # the operator stops: owners are not called

# -- sources -------------------------------------------------------------------------------
SOURCE_FIRST_SECONDS = 2.0       # a model's own retry of a source that failed, and the probe's
SOURCE_MAX_SECONDS = 60.0
RELAPSE_SECONDS = 60.0           # a source failing again this soon after answering resumes its backoff


def source_retry_after(failing_for: float | None) -> float:
    """Seconds until a model reads a failed source again, from how long it has failed (None:
    not failing): at least 2, at most 60, so retries fall at about 2, 4, 8, 16, 32, 64 s,
    then every 60 s after the failure began, with no counter to keep."""
    if failing_for is None:
        return SOURCE_FIRST_SECONDS
    return min(SOURCE_MAX_SECONDS, max(SOURCE_FIRST_SECONDS, failing_for))


def source_backoff(failures: int) -> float:
    """Seconds from a failed probe of a shared source to the next: 2, 4, 8, ... capped at 60."""
    return min(SOURCE_MAX_SECONDS, SOURCE_FIRST_SECONDS * 2 ** max(0, failures))
