"""The one object every capture is, whatever ``gradtrace.attach`` attached to: a DDP or FSDP2 model, a
DeepSpeed engine, a Trainer's callback. Nothing here imports torch."""

from __future__ import annotations

import os


class Capture:
    """This rank's capture, as :func:`gradtrace.attach` returns it.

    ``out_dir``: the trace set's folder; ``path``: this rank's ``rank-NNNNN.gtrace`` (None until a
    Trainer has started training); ``recorded``: frames written so far, by phase ("PRE_REDUCE",
    "POST_REDUCE", "FINAL", "STEP"); ``close()`` restores what was hooked and finishes the file. A
    context manager: ``with gradtrace.attach(...) as cap:`` closes it on leaving, also on an exception.
    One per rank, not thread-safe."""

    # Attributes or properties of each kind of capture.
    out_dir: str
    path: str | None
    recorded: dict[str, int]

    def close(self) -> None:
        """Restores what was hooked and finishes this rank's trace; idempotent."""
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in getattr(self, "recorded", {}).items())
        return f"<gradtrace {type(self).__name__} {os.fspath(getattr(self, 'out_dir', ''))!r}: {counts}>"


NO_FRAMES = {"PRE_REDUCE": 0, "POST_REDUCE": 0, "FINAL": 0, "STEP": 0}
