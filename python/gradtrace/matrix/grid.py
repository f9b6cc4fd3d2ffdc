"""Layouts: a grid's cartesian product (``dp=1,2 tp=1,2``), explicit ones (``pp=2,dp=2``), their names and world."""

from __future__ import annotations

import itertools
import re

# The parallel degrees: a layout's world is their product. Any other name (gas, ep, a flag of the script's) is
# passed to the script but takes no ranks of its own.
DEGREES = ("dp", "tp", "pp", "cp", "sp")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class BadGrid(ValueError):
    """A grid or layout word that does not parse: the command exits 2 with it."""


def _value(name: str, text: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,5}", text):
        raise BadGrid(f"{name}={text}: a value must be a positive integer")
    return int(text)


def parse_axis(word: str) -> tuple[str, list[int]]:
    """``dp=1,2`` -> ("dp", [1, 2])."""
    name, sep, values = word.partition("=")
    if not sep or not _NAME.match(name):
        raise BadGrid(f"{word!r}: expected NAME=V1,V2,... (a lowercase name, positive integers)")
    out = [_value(name, v) for v in values.split(",")]
    if len(set(out)) != len(out):
        raise BadGrid(f"{word!r}: a value is repeated")
    return name, out


def parse_layout(text: str) -> dict[str, int]:
    """``pp=2,dp=2`` -> {"pp": 2, "dp": 2}."""
    out = {}
    for part in filter(None, text.split(",")):
        name, sep, value = part.partition("=")
        if not sep or not _NAME.match(name):
            raise BadGrid(f"{text!r}: expected NAME=V,NAME=V,... (e.g. pp=2,dp=2)")
        if name in out:
            raise BadGrid(f"{text!r}: {name} is given twice")
        out[name] = _value(name, value)
    if not out:
        raise BadGrid(f"{text!r}: an empty layout")
    return out


def expand(axes: list[tuple[str, list[int]]], extra: list[dict]) -> list[dict]:
    """The grid's product, then the explicit layouts, each with every axis (missing ones are 1), no repeats."""
    names = [n for n, _ in axes]
    for layout in extra:
        names += [n for n in layout if n not in names]
    out = []
    for values in itertools.product(*[v for _, v in axes]) if axes else [()]:
        out.append({**{n: 1 for n in names}, **dict(zip([n for n, _ in axes], values))})
    for layout in extra:
        out.append({**{n: 1 for n in names}, **layout})
    seen, unique = set(), []
    for layout in out:
        key = tuple(sorted(layout.items()))
        if key not in seen:
            seen.add(key)
            unique.append(layout)
    return unique


def world(layout: dict) -> int:
    n = 1
    for d in DEGREES:
        n *= int(layout.get(d, 1))
    return n


def name(layout: dict) -> str:
    """``dp2-tp1-gas1``: the layout's folder and column name, in the grid's axis order."""
    return "-".join(f"{k}{v}" for k, v in layout.items())


def from_name(text: str) -> dict | None:
    """The layout a folder name such as ``dp2-tp1-gas1`` spells, or None."""
    out = {}
    for part in text.split("-"):
        m = re.fullmatch(r"([a-z][a-z_]*)([1-9][0-9]{0,5})", part)
        if not m or m.group(1) in out:
            return None
        out[m.group(1)] = int(m.group(2))
    return out or None


def label(layout: dict) -> str:
    """``dp=2,tp=1,gas=1``: how the command line writes it."""
    return ",".join(f"{k}={v}" for k, v in layout.items())
