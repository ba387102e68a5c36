"""Rebase or reconstruct without reflink: the pure cost rule, each branch, and its reasons."""

from __future__ import annotations

import pytest

from bundle.rebase_cost import decide_rebase

MIB = 1 << 20


def decide(reflink=False, rebase_fetch=10 * MIB, reconstruct_fetch=110 * MIB, copy=100 * MIB,
           source_bps=None, copy_bps=None):
    return decide_rebase(reflink=reflink, rebase_fetch_bytes=rebase_fetch,
                         reconstruct_fetch_bytes=reconstruct_fetch, copy_bytes=copy,
                         source_bps=source_bps, copy_bps=copy_bps)


def test_with_reflink_the_rebase_is_kept_whatever_the_speeds():
    d = decide(reflink=True, source_bps=1000 * MIB, copy_bps=1 * MIB)
    assert d.rebase and d.reason is None


def test_nothing_to_copy_means_nothing_to_weigh():
    d = decide(copy=0, rebase_fetch=110 * MIB, source_bps=1000 * MIB, copy_bps=1 * MIB)
    assert d.rebase and d.reason is None


@pytest.mark.parametrize("source_bps, copy_bps, unknown", [
    (None, None, "source and local copy throughput unknown"),
    (None, 100 * MIB, "source throughput unknown"),
    (100 * MIB, None, "local copy throughput unknown"),
    (0.0, 100 * MIB, "source throughput unknown"),
])
def test_unknown_throughputs_keep_the_rebase_and_say_so(source_bps, copy_bps, unknown):
    d = decide(source_bps=source_bps, copy_bps=copy_bps)
    assert d.rebase
    assert d.reason == (f"no reflink: rebase kept (copying 100.0 MiB locally); {unknown}, "
                        "no earlier measurement")


def test_a_slow_source_keeps_the_rebase_and_says_why():
    d = decide(source_bps=50 * MIB, copy_bps=200 * MIB)
    assert d.rebase
    assert d.reason == ("no reflink: copying 100.0 MiB locally (~0.50 s at 200 MiB/s) costs less "
                        "than fetching them (~2.00 s at 50 MiB/s); rebasing")


def test_a_fast_source_reconstructs_and_says_why():
    d = decide(source_bps=400 * MIB, copy_bps=100 * MIB)
    assert not d.rebase
    assert d.reason == ("no reflink: copying 100.0 MiB locally (~1.00 s at 100 MiB/s) costs more "
                        "than fetching them (~0.25 s at 400 MiB/s); reconstructing")


def test_equal_costs_reconstruct_reading_no_donor():
    d = decide(source_bps=100 * MIB, copy_bps=100 * MIB)
    assert not d.rebase and "costs as much as fetching them" in d.reason


def test_saved_bytes_differ_from_copied_bytes_and_both_are_named():
    # the rebase copies 100 MiB but saves fetching only 40 MiB of them
    d = decide(rebase_fetch=70 * MIB, reconstruct_fetch=110 * MIB, source_bps=100 * MIB,
               copy_bps=200 * MIB)
    assert not d.rebase
    assert "(~0.50 s at 200 MiB/s) costs more than fetching 40.0 MiB (~0.40 s" in d.reason
