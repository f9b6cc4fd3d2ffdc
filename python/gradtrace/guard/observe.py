"""What the guard keeps of one step's records: per record slice, the values at the sketch's positions
it holds and its sum of squares, as device tensors until the step ends, then host arrays in one copy
(one device sync per step, where the step's own optimizer usually syncs anyway)."""

from __future__ import annotations

import numpy as np

from .. import _gtcodec

SKETCH_K = 16  # positions per parameter: enough for a divisor fit (an exact relation), few bytes to exchange


class Positions:
    """The sketch's positions of every parameter of the table (global element indices, sorted, the same on
    every rank), and per slice the local indices of those it holds (cached: slices repeat every step)."""

    def __init__(self, names, numels, k: int = SKETCH_K):
        self._names, self._numels, self._k = list(names), [int(n) for n in numels], k
        self._global: dict[int, np.ndarray] = {}
        self._local: dict[tuple, tuple] = {}
        self._held: dict[tuple, np.ndarray] = {}

    def of(self, pid: int) -> np.ndarray:
        """Parameter ``pid``'s positions."""
        pos = self._global.get(pid)
        if pos is None:
            pos = np.asarray(_gtcodec.sketch_positions(self._names[pid], self._numels[pid], self._k), dtype=np.int64)
            self._global[pid] = pos
        return pos

    def held(self, pid: int, offset: int, count: int) -> np.ndarray:
        """The global positions in elements [offset, offset+count) of parameter ``pid`` (cached: pieces repeat)."""
        key = (pid, offset, count)
        hit = self._held.get(key)
        if hit is None:
            pos = self.of(pid)
            hit = self._held[key] = pos[(pos >= offset) & (pos < offset + count)]
        return hit

    def in_slice(self, pid: int, offset: int, count: int, device):
        """(index tensor on ``device``, global positions) of the positions in elements [offset, offset+count)."""
        key = (pid, offset, count, str(device))
        hit = self._local.get(key)
        if hit is None:
            import torch

            held = self.held(pid, offset, count)
            hit = (torch.as_tensor(held - offset, dtype=torch.long, device=device), held)
            self._local[key] = hit
        return hit


class StepRecords:
    """One step's records on this rank, as the guard keeps them: ``entries`` (one dict per slice: phase, micro,
    bucket, group, param, offset, count, positions, divisor) and, once :meth:`finish` ran, each entry's
    ``values`` (float64 at its positions) and ``sumsq``."""

    def __init__(self, positions: Positions, moments: bool = False):
        self.positions = positions
        self.moments = moments  # FINAL's sum and abs max too (a reference run compares moments)
        self.entries: list[dict] = []
        self._values: list = []  # device tensors, one per entry
        self._norms: list = []   # 0-dim device tensors (the slice's 2-norm), one per entry
        self._sums: list = []    # with moments: each FINAL entry's sum and abs max, in entry order
        self._maxes: list = []
        self.reported_norm: float | None = None

    def add(self, record: dict) -> None:
        """A BucketRecord as the adapters write it (values: tensors)."""
        import torch

        slices = [s for s in record.get("slices", ()) if hasattr(s.get("values"), "reshape")]
        if not slices:
            return
        flats = [s["values"].detach().reshape(-1) for s in slices]
        norms = torch._foreach_norm(flats)
        if self.moments and record["phase"] == "FINAL":
            self._sums += [f.sum() for f in flats]
            self._maxes += list(torch._foreach_norm(flats, float("inf")))
        for s, flat, norm in zip(slices, flats, norms):
            pid, offset = int(s["param_id"]), int(s.get("offset", 0))
            index, held = self.positions.in_slice(pid, offset, flat.numel(), flat.device)
            self.entries.append({"phase": record["phase"], "micro": int(record.get("micro_step", 0)),
                                 "bucket": int(record.get("bucket_id", 0)), "group": record.get("group", ""),
                                 "param": pid, "offset": offset, "count": int(flat.numel()), "positions": held,
                                 "divisor": float(record.get("divisor", 0.0) or 0.0)})
            self._values.append(flat.index_select(0, index))
            self._norms.append(norm)

    def finish(self) -> None:
        """Copies every entry's values and norm to the host, in one transfer per kind."""
        import torch

        if not self.entries:
            return
        flat = _host([v.to(torch.float64) for v in self._values])
        norms = _host([n.to(torch.float64).reshape(1) for n in self._norms])
        at = 0
        for e, n in zip(self.entries, norms):
            k = len(e["positions"])
            e["values"] = flat[at:at + k]
            e["sumsq"] = float(n) ** 2
            at += k
        if self._sums:
            sums = _host([x.to(torch.float64).reshape(1) for x in self._sums])
            maxes = _host([x.to(torch.float64).reshape(1) for x in self._maxes])
            for e, total, top in zip((e for e in self.entries if e["phase"] == "FINAL"), sums, maxes):
                e["sum"], e["absmax"] = float(total), float(top)
        self._values, self._norms, self._sums, self._maxes = [], [], [], []


def _host(tensors) -> np.ndarray:
    """The tensors concatenated on the host: one copy per device they are on."""
    import torch

    by_device: dict = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out: list = [None] * len(tensors)
    for device, idx in by_device.items():
        joined = torch.cat([tensors[i] for i in idx]).cpu().numpy()
        at = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = joined[at:at + n]
            at += n
    return np.concatenate(out) if out else np.zeros(0)
