"""Live weights of a torch module, addressed as the checkpoint's safetensors files name them.

The owner's in-place machinery (:mod:`owner.admission`, :mod:`owner.inplace`) speaks of
tensors by their names in the weights files and of rows as the bit patterns of their
values: unsigned integers of the dtype's width (uint16 for BF16 and F16, uint32 for F32).
:func:`bind` matches every tensor of a checkpoint's files (by its parsed
:class:`~owner.safetensors_layout.Layout`) to the tensor of a module that holds it: the
same name, or the name with or without the model's ``base_model_prefix`` (older GPT-2
files say ``h.0...`` for ``transformer.h.0...``), and the same shape. It refuses a file
tensor the module does not have, one of another shape, and a module parameter no file
provides (tied parameters count as provided when one of them is), so a config that does
not match its tensors is a clear error. Binding a module built on the ``meta`` device
checks a checkpoint before a byte of it is loaded.

:class:`LiveWeights` is the bound module as a :class:`~owner.inplace.RowStore`: rows are
read by indexing (a copy, on the host) and written with ``copy_`` per contiguous run of
rows into the live parameters, in their own dtype, on whatever device they sit. A tensor
takes part in place only when the module holds it in the file's dtype, so live bytes
equal file bytes.
:meth:`LiveWeights.load_files` copies a whole revision into the bound tensors: a reload
that keeps the module.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from .inplace import NeedsReload, StagedUpdate
from .revisions import Revision, map_verified
from .safetensors_layout import Layout, parse_layout

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_SIGNED = {2: torch.int16, 4: torch.int32}  # torch views a tensor as integers of its width


def _bits(t: torch.Tensor) -> np.ndarray:
    """The values of ``t`` as unsigned bit patterns of their width, on the host (a view
    when ``t`` is there, a copy from a device)."""
    size = t.element_size()
    return t.view(_SIGNED[size]).cpu().numpy().view(f"u{size}")


class WeightsMismatch(ValueError):
    """The checkpoint's tensors do not match the module its config describes."""


def _key(name: str, live: dict, prefix: str) -> str | None:
    for key in (name, f"{prefix}.{name}" if prefix else None,
                name.removeprefix(f"{prefix}.") if prefix else None):
        if key in live:
            return key
    return None


def bind(module: torch.nn.Module, layouts: dict[str, Layout]) -> dict[str, torch.Tensor]:
    """File tensor name -> the module's tensor holding it; raise WeightsMismatch (see above)."""
    live = module.state_dict(keep_vars=True)
    prefix = getattr(module, "base_model_prefix", "")
    bound: dict[str, torch.Tensor] = {}
    provided: set[int] = set()
    for path, layout in sorted(layouts.items()):
        for slot in layout.tensors:
            key = _key(slot.name, live, prefix)
            if key is None:
                raise WeightsMismatch(f"{path}: tensor {slot.name} is not one the config's module has")
            if slot.name in bound:
                raise WeightsMismatch(f"tensor {slot.name} appears in more than one weights file")
            if tuple(live[key].shape) != slot.shape:
                raise WeightsMismatch(f"{path}: tensor {slot.name} has shape {slot.shape}, "
                                      f"the config implies {tuple(live[key].shape)}")
            bound[slot.name] = live[key]
            provided.add(id(live[key]))
    missing = [n for n, p in module.named_parameters(remove_duplicate=True) if id(p) not in provided]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise WeightsMismatch(f"the config implies tensor {missing[0]}{more}, which no weights file holds")
    return {name: t.detach() for name, t in bound.items()}


def weights_layouts(rev: Revision, consume=None) -> dict[str, Layout]:
    """Hash-check every weights file of ``rev`` (mapped, chunks on all cores) and parse its
    layout; ``consume(path, layout, map)`` may read the verified map before it closes."""
    from bundle.manifest import Role

    layouts = {}
    for entry in rev.manifest.files_with(Role.weights):
        if not entry.path.endswith(".safetensors"):
            raise WeightsMismatch(f"{entry.path}: the torch backend reads safetensors weights only")
        mm = map_verified(rev, entry)
        try:
            layouts[entry.path] = parse_layout(mm, entry.size)
            if consume is not None:
                consume(entry.path, layouts[entry.path], mm)
        finally:
            mm.close()
    if not layouts:
        raise WeightsMismatch("the revision has no weights file")
    return layouts


def _runs(rows: np.ndarray):
    """(first row, end row, offset into rows) of each run of consecutive sorted rows."""
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.r_[0, breaks]
    ends = np.r_[breaks, len(rows)]
    for a, b in zip(starts.tolist(), ends.tolist()):
        yield int(rows[a]), int(rows[b - 1]) + 1, a


class LiveWeights:
    """A bound module's tensors as a RowStore (see the module docstring)."""

    def __init__(self, layouts: dict[str, Layout], bound: dict[str, torch.Tensor]):
        self._layouts = layouts
        self.bound = bound
        self.file_dtypes = {s.name: s.dtype for lay in layouts.values() for s in lay.tensors}

    def tensor(self, name: str) -> torch.Tensor:
        t = self.bound.get(name)
        if t is None or t.dtype != DTYPES.get(self.file_dtypes.get(name)):
            raise NeedsReload(f"tensor {name} is not held in its file's dtype; only a reload can change it")
        return t

    # -- RowStore ----------------------------------------------------------------
    def layouts(self) -> dict[str, Layout]:
        return self._layouts

    def tensor_bytes(self, name: str, start: int, end: int) -> bytes:
        flat = self.tensor(name).reshape(-1).view(torch.uint8)
        return flat[start:end].cpu().numpy().tobytes()

    def live_bits(self, name: str) -> np.ndarray:
        """Bit patterns, tensor-shaped: a view on the host, a copy from a device."""
        return _bits(self.tensor(name))

    def read_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        t = self.tensor(name)
        index = torch.as_tensor(rows, dtype=torch.long, device=t.device)
        return _bits(t.index_select(0, index))

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Write bit patterns of ``t``'s own width into rows of the live tensor ``t``."""
        t = self.tensor(name)
        size = t.element_size()
        if values.dtype.itemsize != size:
            raise ValueError(f"tensor {name}: {values.dtype.itemsize}-byte values for {t.dtype} rows")
        bits = np.ascontiguousarray(values).view(f"i{size}")
        src = torch.from_numpy(bits).view(t.dtype).to(t.device)
        with torch.no_grad():
            for a, b, at in _runs(np.asarray(rows)):
                t[a:b].copy_(src[at:at + b - a])

    def release_staged(self, update: StagedUpdate) -> None:
        update.patches = []

    # -- reload keeping the module ----------------------------------------------------
    def load_files(self, rev: Revision) -> dict[str, Layout]:
        """Copy every tensor of ``rev``'s verified weights files into the bound tensors."""
        def copy(path: str, layout: Layout, mm) -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the map is read-only; torch warns, we only read
                for slot in layout.tensors:
                    t = self.bound.get(slot.name)
                    if t is None or tuple(t.shape) != slot.shape:
                        raise WeightsMismatch(f"{path}: tensor {slot.name} does not fit the kept module")
                    count = (slot.end - slot.start) * 8 // torch.finfo(DTYPES[slot.dtype]).bits
                    if count == 0:
                        continue
                    src = torch.frombuffer(mm, dtype=DTYPES[slot.dtype], count=count, offset=slot.start)
                    with torch.no_grad():
                        t.copy_(src.view(slot.shape))
                    del src

        layouts = weights_layouts(rev, copy)
        if {s.name for lay in layouts.values() for s in lay.tensors} != set(self.bound):
            raise WeightsMismatch("the revision's weights files hold other tensors than the kept module's")
        self._layouts = layouts
        return layouts
