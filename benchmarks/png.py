"""A tiny log-log line-chart rasteriser writing PNG with zlib + struct (no plotting dependency).

Chosen over matplotlib: the chart is one simple figure, and a benchmark-only dependency of
~10 MB (plus fonttools, pillow, ...) for it would be the only non-JAX dependency of the repo."""
from __future__ import annotations

import math
import struct
import zlib

# 3x5 glyphs, rows top to bottom, 3 bits each (MSB = left column)
_FONT = {
    "0": [7, 5, 5, 5, 7], "1": [2, 6, 2, 2, 7], "2": [7, 1, 7, 4, 7], "3": [7, 1, 7, 1, 7],
    "4": [5, 5, 7, 1, 1], "5": [7, 4, 7, 1, 7], "6": [7, 4, 7, 5, 7], "7": [7, 1, 1, 2, 2], "8": [7, 5, 7, 5, 7],
    "9": [7, 5, 7, 1, 7], "a": [2, 5, 7, 5, 5], "b": [6, 5, 6, 5, 6], "c": [7, 4, 4, 4, 7], "d": [6, 5, 5, 5, 6],
    "e": [7, 4, 6, 4, 7], "f": [7, 4, 6, 4, 4], "g": [7, 4, 5, 5, 7], "h": [5, 5, 7, 5, 5], "i": [7, 2, 2, 2, 7],
    "j": [1, 1, 1, 5, 7], "k": [5, 5, 6, 5, 5], "l": [4, 4, 4, 4, 7], "m": [5, 7, 7, 5, 5], "n": [6, 5, 5, 5, 5],
    "o": [7, 5, 5, 5, 7], "p": [7, 5, 7, 4, 4], "q": [7, 5, 5, 7, 1], "r": [6, 5, 6, 5, 5], "s": [7, 4, 7, 1, 7],
    "t": [7, 2, 2, 2, 2], "u": [5, 5, 5, 5, 7], "v": [5, 5, 5, 5, 2], "w": [5, 5, 7, 7, 5], "x": [5, 5, 2, 5, 5],
    "y": [5, 5, 2, 2, 2], "z": [7, 1, 2, 4, 7], " ": [0, 0, 0, 0, 0], ".": [0, 0, 0, 0, 2], "=": [0, 7, 0, 7, 0],
    "-": [0, 0, 7, 0, 0], "(": [1, 2, 2, 2, 1], ")": [4, 2, 2, 2, 4], "/": [1, 1, 2, 4, 4], ":": [0, 2, 0, 2, 0],
    ",": [0, 0, 0, 2, 4], "+": [0, 2, 7, 2, 0], "_": [0, 0, 0, 0, 7],
}
# unit letters at x-height (rows 3-5), so that "ms" / "us" never read as capitals "MS" / "US"
_UNITS = {**_FONT, "m": [0, 0, 7, 7, 5], "s": [0, 0, 3, 2, 6], "u": [0, 0, 5, 5, 7], "µ": [0, 5, 5, 7, 4],
          "n": [0, 0, 6, 5, 5]}

COLORS = [(31, 119, 180), (255, 127, 14), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


class Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def set(self, x: int, y: int, c) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def line(self, x0, y0, x1, y1, c, width: int = 1) -> None:
        n = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for k in range(n + 1):
            x = round(x0 + (x1 - x0) * k / n)
            y = round(y0 + (y1 - y0) * k / n)
            for dx in range(-(width // 2), width - width // 2):
                for dy in range(-(width // 2), width - width // 2):
                    self.set(x + dx, y + dy, c)

    def rect(self, x0, y0, x1, y1, c) -> None:
        for y in range(y0, y1):
            for x in range(x0, x1):
                self.set(x, y, c)

    def text(self, x: int, y: int, s: str, c=(0, 0, 0), scale: int = 2, units: bool = False) -> None:
        font = _UNITS if units else _FONT
        for ch in s.lower():
            rows = font.get(ch, _FONT[" "])
            for r, bits in enumerate(rows):
                for col in range(3):
                    if bits & (4 >> col):
                        self.rect(x + col * scale, y + r * scale, x + (col + 1) * scale, y + (r + 1) * scale, c)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def fmt_time(sec: float) -> str:
    for unit, f in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if sec >= f:
            return f"{sec / f:g}{unit}"
    return f"{sec * 1e9:g}ns"


def loglog_chart(path, series: dict[str, list[tuple[float, float]]], title: str, xlabel: str,
                 w: int = 900, h: int = 480) -> None:
    """series: label -> [(x, seconds)], drawn on log2 x / log10 y axes, the legend right of the plot
    (never over a line)."""
    pts = [p for s in series.values() for p in s if p[1] > 0]
    xs = [math.log2(p[0]) for p in pts]
    ys = [math.log10(p[1]) for p in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = math.floor(min(ys)), math.ceil(max(ys))
    if y1 == y0:
        y1 += 1
    legend_w = 12 + 8 * max((len(k) for k in series), default=0) + 30
    left, right, top, bottom = 80, w - 20 - legend_w, 40, h - 50
    cv = Canvas(w, h)
    X = lambda v: left + (math.log2(v) - x0) / (x1 - x0) * (right - left)  # noqa: E731
    Y = lambda v: bottom - (math.log10(v) - y0) / (y1 - y0) * (bottom - top)  # noqa: E731
    grey = (220, 220, 220)
    for e in range(y0, y1 + 1):
        y = bottom - (e - y0) / (y1 - y0) * (bottom - top)
        cv.line(left, y, right, y, grey)
        label = fmt_time(10.0 ** e)
        cv.text(left - 8 - 8 * len(label), int(y) - 5, label, units=True)
    for xv in sorted({p[0] for p in pts}):
        x = X(xv)
        cv.line(x, top, x, bottom, grey)
        cv.text(int(x) - 4 * len(str(int(xv))), bottom + 8, str(int(xv)))
    cv.line(left, bottom, right, bottom, (0, 0, 0))
    cv.line(left, top, left, bottom, (0, 0, 0))
    cv.text(left, 12, title)
    cv.text((left + right) // 2 - 4 * len(xlabel), h - 20, xlabel)
    for i, (label, s) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        s = sorted(p for p in s if p[1] > 0)
        for (xa, ya), (xb, yb) in zip(s, s[1:]):
            cv.line(X(xa), Y(ya), X(xb), Y(yb), c, width=2)
        for xa, ya in s:
            cv.rect(int(X(xa)) - 3, int(Y(ya)) - 3, int(X(xa)) + 4, int(Y(ya)) + 4, c)
        ly = top + 8 + 16 * i
        cv.rect(right + 16, ly, right + 28, ly + 10, c)
        cv.text(right + 34, ly, label)
    with open(path, "wb") as f:
        f.write(cv.png())
