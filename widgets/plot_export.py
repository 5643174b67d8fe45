"""Save one plot as PNG or SVG (issue 19, item 8), callable from code and tests; the
file's suffix picks the format; the write is atomic (a temporary file beside it, renamed).

PNG: pyqtgraph's ImageExporter (what the plot's right-click Export… uses). SVG: Qt's own
QSvgGenerator painting the plot's part of the scene — pyqtgraph's SVGExporter fails on
the path data Qt 6 writes (``x,y = c.split(',')``: pyqtgraph issue #3485, open), so it is
not used."""
from __future__ import annotations

import os
from pathlib import Path

import pyqtgraph.exporters as pge
from PySide6.QtCore import QRectF, QSize
from PySide6.QtGui import QPainter
from PySide6.QtSvg import QSvgGenerator


def export_plot(plot_item, path: str | Path, width: int = 1200) -> Path:
    """Write ``plot_item`` (a pyqtgraph PlotItem) to ``path`` (``.png`` or ``.svg``);
    PNGs are ``width`` pixels wide. Raises ValueError for another suffix, OSError when the
    file cannot be written (naming it)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ValueError(f"{path}: give a .png or .svg file name")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")
    try:
        if suffix == ".png":
            ex = pge.ImageExporter(plot_item)
            ex.parameters()["width"] = width
            ex.export(str(tmp))
        else:
            _svg(plot_item, tmp)
        if not tmp.exists() or tmp.stat().st_size == 0:
            raise OSError(f"cannot write {path}: the exporter wrote nothing (is the folder writable?)")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write {path}: {e.strerror or e}") from e
    return path


def _svg(plot_item, path: Path) -> None:
    """The plot item's rectangle of its scene, painted into an SVG file by Qt."""
    rect = plot_item.sceneBoundingRect()
    gen = QSvgGenerator()
    gen.setFileName(str(path))
    gen.setSize(QSize(int(rect.width()), int(rect.height())))
    gen.setViewBox(QRectF(0, 0, rect.width(), rect.height()))
    gen.setTitle("vLLM Dyno plot")
    painter = QPainter(gen)
    try:
        plot_item.scene().render(painter, QRectF(0, 0, rect.width(), rect.height()), rect)
    finally:
        painter.end()
