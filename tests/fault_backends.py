"""Test-only backends that inject one fault into the real cpu backend (shared by the
component and cluster tests; nothing outside tests/ imports this)."""

import numpy as np

from owner.backends.cpu import CpuBackend


class FlipsFirstWrite:
    """Test-only mixin for a RowStore: flips one bit in the first row block written after
    ``writes`` was 0, so read-back verification fails and the journal restores the old rows."""

    writes = 0

    def write_rows(self, name, rows, values):
        self.writes += 1
        if self.writes == 1:
            values = values.copy()
            values[0, 0] ^= np.uint16(1)
        super().write_rows(name, rows, values)


class FaultyWriteCpuBackend(FlipsFirstWrite, CpuBackend):
    """Test-only: the cpu backend whose every in-place update gets one flipped bit."""

    def apply_in_place(self, update):
        self.writes, self.patches = 0, len(update.patches)
        return super().apply_in_place(update)
