"""The old capture entry points (``gradtrace.ddp_adapter.attach``, ``attach_accelerate``, ...) keep working for
one release and say, once per name, that ``gradtrace.attach`` replaces them."""

from __future__ import annotations

import warnings

_SAID: set[str] = set()


def replaced_by_attach(old: str, new: str) -> None:
    """A FutureWarning (shown by default, unlike DeprecationWarning) at the caller's line, once per ``old``."""
    if old in _SAID:
        return
    _SAID.add(old)
    warnings.warn(f"{old} is deprecated and will be removed in the next release: use {new}", FutureWarning,
                  stacklevel=3)
