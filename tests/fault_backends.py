"""Test-only backends that inject one fault into the real cpu backend (shared by the
component and cluster tests; nothing outside tests/ imports this)."""

import numpy as np

from owner.backends.cpu import CpuBackend


class FaultyWriteCpuBackend(CpuBackend):
    """Test-only: flips one bit in the first row block each in-place update writes, so the
    owner's read-back verification fails and its journal restores the old rows."""

    def apply_in_place(self, update):
        self.writes, self.patches = 0, len(update.patches)
        return super().apply_in_place(update)

    def write_rows(self, name, rows, values):
        self.writes += 1
        if self.writes == 1:
            values = values.copy()
            values[0, 0] ^= np.uint16(1)
        super().write_rows(name, rows, values)
