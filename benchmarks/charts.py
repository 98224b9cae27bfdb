"""What the benchmark charts share: saving a chart's numbers beside its PNG, and value labels.

A benchmark script reduces its raw results to the numbers its chart draws (a JSON-ready
dict), saves them as ``docs/<name>.json`` and draws ``docs/<name>.png`` from them, so a
picture can be drawn again, restyled, from the numbers it shows without measuring again:

    python benchmarks/bench_service.py --replot docs/bench_service_digits.json
    python benchmarks/device_scaling.py --replot docs/device_scaling.json
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def pyplot():
    """matplotlib's pyplot on the file-only backend: the benchmarks run on machines with no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def publish(chart: dict, path: Path, plot: Callable[[dict, Path], None]) -> Path:
    """``path`` (a PNG) drawn by ``plot`` from ``chart``, whose numbers go beside it as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(chart, indent=1) + "\n")
    plot(chart, path)
    return path


def replot(numbers: Path, plot: Callable[[dict, Path], None]) -> Path:
    """The PNG beside ``numbers`` drawn again from them."""
    path = numbers.with_suffix(".png")
    plot(json.loads(numbers.read_text()), path)
    return path


def label_bars(ax, bars, texts: Sequence[str], fontsize: float = 9) -> None:
    """Each bar's value written on top of it, so a reader need not read it off the axis."""
    for bar, text in zip(bars, texts, strict=True):
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), textcoords="offset points",
                    xytext=(0, 3), ha="center", va="bottom", fontsize=fontsize)
    ax.margins(y=0.15)  # room above the tallest bar for its label


def label_points(ax, xs: Sequence[float], ys: Sequence[float], texts: Sequence[str], below: Sequence[bool],
                 color: str | None = None) -> None:
    """Each point's value beside it: over it to the left, or (where ``below``) under it to the right,
    so the labels of a third line close by clear these two as well."""
    for x, y, text, under in zip(xs, ys, texts, below, strict=True):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(3, -3) if under else (-3, 3),
                    ha="left" if under else "right", va="top" if under else "bottom", fontsize=7, color=color)


def below_nearest(lines: Sequence[Sequence[float]]) -> list[list[bool]]:
    """Per line and point: whether its label goes under the point.

    Of two lines that run close together at a point, the lower one's label goes under it and the
    higher one's over it, so the two labels never meet; "close" is the nearest other line there
    (by ratio, as the charts' axes are often logarithmic), ties broken by the order of the lines.
    """
    def distance(a: float, b: float) -> float:
        return max(a, b) / min(a, b) if min(a, b) > 0 else abs(a - b)

    below = []
    for i, line in enumerate(lines):
        row = []
        for j, y in enumerate(line):
            others = [(distance(y, other[j]), k) for k, other in enumerate(lines) if k != i]
            if not others:
                row.append(False)
                continue
            _, k = min(others)
            row.append(lines[k][j] > y or (lines[k][j] == y and k < i))
        below.append(row)
    return below
