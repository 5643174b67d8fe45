"""Render resources/icons/vllm-dyno.svg to PNGs in the usual hicolor sizes (Qt, offscreen)."""
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parent.parent
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def main() -> int:
    app = QGuiApplication(sys.argv)  # noqa: F841 (needed for fonts/rendering)
    svg = ROOT / "resources" / "icons" / "vllm-dyno.svg"
    r = QSvgRenderer(str(svg))
    for s in SIZES:
        img = QImage(s, s, QImage.Format_ARGB32)
        img.fill(Qt.transparent)
        p = QPainter(img)
        p.setRenderHint(QPainter.Antialiasing)
        r.render(p)
        p.end()
        out = ROOT / "resources" / "icons" / f"vllm-dyno-{s}.png"
        img.save(str(out))
    print(f"rendered {len(SIZES)} icon sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
