"""Whether a rebase is worth it on a store whose filesystem cannot clone.

With reflink (XFS, btrfs) the chunks a rebase takes from the donor are shared, not
written, so a rebase admitted by ``minReuse`` always costs less than a reconstruct. Without
reflink (ext4) those chunks are *copied*: the rebase saves fetching them but still reads
them from the donor and writes every byte. When the source is fast and the disk is not,
that copy costs more than the fetch it saves, and reconstructing is faster.

:func:`decide_rebase` weighs the two, given throughputs the store measured before:

- ``source_bps``: bytes per second of earlier fetches from this source, each timed from
  the first byte asked for to the last byte hashed and written into the blob;
- ``copy_bps``: bytes per second of earlier local copies of donor chunks, each timed
  around the in-kernel copy, which reads the donor and writes the blob.

A rebase is kept only if ``saved fetch bytes / source_bps > copied bytes / copy_bps``.
The donor read is counted, inside ``copy_bps``: the copy is timed as a whole, so adding a
separate read term would count it twice. The write is in both figures (a fetched chunk is
written too), so the comparison is between two ways of getting the same bytes into the
blob. Both leave out the final ``fsync``, the same for either route.

The function is pure: the store measures, the planner calls this.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RebaseDecision", "decide_rebase"]
MIB = 1 << 20


@dataclass(frozen=True)
class RebaseDecision:
    """``rebase``: keep the admitted rebase (else reconstruct). ``reason``: why, or None
    when there was nothing to weigh (reflink, or nothing to copy)."""

    rebase: bool
    reason: str | None


def _mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def _rate(bps: float) -> str:
    v = bps / MIB
    return f"{v:.0f} MiB/s" if v >= 10 else f"{v:.2g} MiB/s"


def _known(bps: float | None) -> bool:
    return bps is not None and bps > 0


def decide_rebase(*, reflink: bool, rebase_fetch_bytes: int, reconstruct_fetch_bytes: int,
                  copy_bytes: int, source_bps: float | None,
                  copy_bps: float | None) -> RebaseDecision:
    """Keep an admitted rebase, or reconstruct because copying costs more than fetching.

    ``rebase_fetch_bytes`` / ``reconstruct_fetch_bytes`` are what each method would fetch;
    ``copy_bytes`` what the rebase would copy from the donor. A throughput of None (or not
    positive) is unknown: the rebase is kept, as before this rule, and the reason says so.
    """
    if reflink or copy_bytes <= 0:
        return RebaseDecision(True, None)
    copying = f"copying {_mib(copy_bytes)} locally"
    if not (_known(source_bps) and _known(copy_bps)):
        unknown = " and ".join(name for name, bps in (("source", source_bps),
                                                      ("local copy", copy_bps))
                               if not _known(bps))
        return RebaseDecision(True, f"no reflink: rebase kept ({copying}); {unknown} "
                                    "throughput unknown, no earlier measurement")
    assert source_bps is not None and copy_bps is not None
    saved = max(reconstruct_fetch_bytes - rebase_fetch_bytes, 0)
    copy_s, fetch_s = copy_bytes / copy_bps, saved / source_bps
    copy = f"{copying} (~{copy_s:.2f} s at {_rate(copy_bps)})"
    fetch = (f"fetching {'them' if saved == copy_bytes else _mib(saved)} "
             f"(~{fetch_s:.2f} s at {_rate(source_bps)})")
    if fetch_s > copy_s:
        return RebaseDecision(True, f"no reflink: {copy} costs less than {fetch}; rebasing")
    than = "more than" if copy_s > fetch_s else "as much as"
    return RebaseDecision(False, f"no reflink: {copy} costs {than} {fetch}; reconstructing")
