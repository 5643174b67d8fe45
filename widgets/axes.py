"""Axis helpers for pyqtgraph: a base-2 log axis whose ticks read 1, 2, 4, 8 … ."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg


def log2(values) -> np.ndarray:
    """Data → axis coordinates for :class:`Log2Axis` (values must be > 0)."""
    return np.log2(np.asarray(values, dtype=float))


class Log2Axis(pg.AxisItem):
    """Plot ``log2(x)``; ticks at whole powers of two labelled with the plain value."""

    def tickValues(self, minVal, maxVal, size):
        lo, hi = math.floor(min(minVal, maxVal)), math.ceil(max(minVal, maxVal))
        step = max(1, math.ceil((hi - lo + 1) / 12))
        return [(step, [float(v) for v in range(lo, hi + 1, step)])]

    def tickStrings(self, values, scale, spacing):
        return [f"{2 ** v:g}" for v in values]


class PlainLogAxis(pg.AxisItem):
    """An axis for ``setLogMode(..., True)`` whose labels read 50, 100, 200, 500 … (plain
    numbers, only at 1-2-5 steps) instead of pyqtgraph's ``5·10¹`` form."""

    def logTickStrings(self, values, scale, spacing):
        out = []
        for v in values:
            x = 10 ** float(v) * scale
            mant = x / 10 ** math.floor(math.log10(x)) if x > 0 else 0
            out.append(f"{x:,.10g}" if any(abs(mant - m) < 1e-6 for m in (1, 2, 5)) else "")
        return out


def nice_step(raw: float) -> float:
    """The smallest 1-2-5 × 10^k step ≥ ``raw`` (> 0): 0.3 → 0.5, 7 → 10, 120 → 200."""
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def place_line(line: pg.InfiniteLine, value: float, text: str) -> None:
    """Show ``line`` at ``value`` with label ``text`` (a hidden line's label would not update)."""
    line.show()
    line.setValue(value)
    if line.label is not None:
        line.label.setFormat(text.replace("{", "{{").replace("}", "}}"))
