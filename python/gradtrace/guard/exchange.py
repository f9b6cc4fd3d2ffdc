"""The guard's one collective per step: every rank's payload to every rank (an all_gather of pickled bytes) on
a gloo group of the guard's own, run by a thread of the guard's own, so that the training thread never waits
on it and the training's own collectives never interleave with it. The group's timeout bounds a wait for a
rank that never sends; a rank that dies ends the wait at once (gloo sees its connection close)."""

from __future__ import annotations

import pickle
import queue
import sys
import threading
from datetime import timedelta

from .. import _gtcodec


class Exchange:
    """``submit(payload, done)``: ``done(payloads, bytes_sent, error)`` runs on the guard's thread with every
    rank's payload (a list by rank) or the error of the exchange."""

    def __init__(self, world: int, timeout_s: float):
        self.world = world
        self.group = None
        if world > 1:
            import torch.distributed as tdist

            # Every rank creates it (a collective at attach), in the same order, as new_group requires.
            self.group = tdist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="gradtrace-guard", daemon=True)
        self._thread.start()

    def submit(self, payload, done) -> None:
        self._jobs.put((payload, done))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            payload, done = job
            try:
                blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
                if self.world > 1:
                    import torch.distributed as tdist

                    blobs: list = [None] * self.world
                    tdist.all_gather_object(blobs, blob, group=self.group)
                    payloads = [pickle.loads(b) for b in blobs]
                else:
                    payloads = [payload]
            except Exception as e:  # noqa: BLE001 - a failed exchange is reported by the guard, never raised here
                payloads, blob, error = None, b"", e
            else:
                error = None
            try:
                done(payloads, len(blob), error)
            except Exception as e:  # noqa: BLE001 - said, and the thread lives on: later steps still get an answer
                sys.stderr.write(_gtcodec.terminal_safe(f"gradtrace guard: WARNING: internal error on the guard's "
                                                        f"thread: {type(e).__name__}: {e}") + "\n")

    def close(self, timeout_s: float) -> bool:
        """Lets the thread finish the steps submitted; True when it did within ``timeout_s``."""
        self._jobs.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
