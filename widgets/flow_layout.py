"""A layout that wraps its widgets onto the next row when the width runs out (Qt's Flow
Layout example, https://doc.qt.io/qt-6/qtwidgets-layouts-flowlayout-example.html): the
button rows of the Tune, History and Profiles tabs, whose one-row width made the window
wider than a 1280-pixel screen (issue 37, item 7)."""
from __future__ import annotations

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QSizePolicy, QStyle, QWidget


class FlowLayout(QLayout):
    """Items left to right, wrapped to as many rows as the width needs (px spacing
    ``spacing``, or the style's). Its minimum width is its widest item; its height
    follows its width (``hasHeightForWidth``)."""

    def __init__(self, parent: QWidget | None = None, spacing: int = -1) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 (Qt's name)
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802
        return self._do_layout(QRect(0, 0, width, 0), apply=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802
        super().setGeometry(rect)
        self._do_layout(rect, apply=True)

    def sizeHint(self) -> QSize:  # noqa: N802
        """All items on one row (what it takes when there is room)."""
        w = h = 0
        visible = [it for it in self._items if not it.isEmpty()]
        for it in visible:
            s = it.sizeHint()
            w += s.width()
            h = max(h, s.height())
        w += self._gap(Qt.Horizontal) * max(0, len(visible) - 1)
        m = self.contentsMargins()
        return QSize(w + m.left() + m.right(), h + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802
        """The widest (and tallest) item: one item a row."""
        size = QSize()
        for it in self._items:
            if not it.isEmpty():
                size = size.expandedTo(it.minimumSize())
        m: QMargins = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _gap(self, orientation: Qt.Orientation) -> int:
        if self._spacing >= 0:
            return self._spacing
        parent = self.parent()
        if isinstance(parent, QWidget):
            pm = QStyle.PM_LayoutHorizontalSpacing if orientation == Qt.Horizontal else QStyle.PM_LayoutVerticalSpacing
            gap = parent.style().pixelMetric(pm, None, parent)
            if gap >= 0:
                return gap
        return 6

    def _do_layout(self, rect: QRect, apply: bool) -> int:
        """Place the items in ``rect`` (when ``apply``); returns the height used, px."""
        m = self.contentsMargins()
        r = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        x, y, row_h = r.x(), r.y(), 0
        hgap, vgap = self._gap(Qt.Horizontal), self._gap(Qt.Vertical)
        for it in self._items:
            if it.isEmpty():
                continue
            s = it.sizeHint()
            if x + s.width() > r.right() + 1 and row_h > 0:  # wrap
                x, y = r.x(), y + row_h + vgap
                row_h = 0
            if apply:
                it.setGeometry(QRect(QPoint(x, y), s))
            x += s.width() + hgap
            row_h = max(row_h, s.height())
        return y + row_h - rect.y() + m.bottom()


def flow_row(widgets) -> QWidget:
    """A widget holding ``widgets`` in a :class:`FlowLayout` (a row that wraps), its
    height following its width."""
    holder = QWidget()
    lay = FlowLayout(holder)
    for w in widgets:
        lay.addWidget(w)
    sp = holder.sizePolicy()
    sp.setHeightForWidth(True)
    sp.setVerticalPolicy(QSizePolicy.Minimum)
    holder.setSizePolicy(sp)
    return holder
