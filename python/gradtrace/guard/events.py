"""The guard's log, ``out_dir/rank-NNNNN.guard.jsonl``: one JSON object a line, appended and flushed line by
line (a crash keeps every line written), each with ``event`` (``attach``, ``scope``, ``violation``,
``disabled``, ``summary``), ``rank``, ``time`` (Unix seconds) and the event's fields (docs/user/guard.md)."""

from __future__ import annotations

import json
import os
import time

from .. import _gtcodec

def log_path(out_dir, rank: int) -> str:
    """``out_dir/rank-NNNNN.guard.jsonl``, beside the rank's trace file."""
    name = _gtcodec.rank_file_name(int(rank))
    return os.path.join(os.fspath(out_dir), name[:-len(".gtrace")] + ".guard.jsonl")


class EventLog:
    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def write(self, event: str, **fields) -> dict:
        line = {"event": event, "rank": self.rank, "time": round(time.time(), 3), **fields}
        if self._file is not None:
            self._file.write(json.dumps(line, allow_nan=False, default=str) + "\n")
            self._file.flush()
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
