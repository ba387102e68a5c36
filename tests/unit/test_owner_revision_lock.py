"""The revision lock: requests share it, a transition holds it alone and is not starved,
a waiting request gives up after its limit, and a closed holder turns requests away."""

import threading

import pytest

from owner.revision_lock import LockClosed, RevisionLock, WaitExpired


def hold_exclusive(lock, closed=False):
    """Take the exclusive side in a thread; returns an event set once it is taken and a
    function that releases it and waits until it is released."""
    taken, release = threading.Event(), threading.Event()

    def run():
        with lock.exclusive(closed):
            taken.set()
            release.wait(5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def done():
        release.set()
        thread.join(5)
    return taken, done


def test_requests_share_and_a_transition_waits_for_them_while_new_requests_queue_behind_it():
    lock = RevisionLock()
    with lock.shared(1), lock.shared(1):   # two requests at once
        taken, done = hold_exclusive(lock)
        assert not taken.wait(0.05)        # the transition waits for the requests in flight
        with pytest.raises(WaitExpired):   # a new request queues behind it (writer preference)
            with lock.shared(0.01):
                pass
    assert taken.wait(1)
    done()
    with lock.shared(1):                   # released: requests flow again
        pass


def test_a_closed_holder_turns_requests_away_at_once_and_reopens_on_release():
    lock = RevisionLock()
    taken, done = hold_exclusive(lock, closed=True)
    assert taken.wait(1)
    with pytest.raises(LockClosed):
        with lock.shared(30):              # would wait 30 s if it queued: it must not
            pass
    done()
    with lock.shared(1):
        pass
