"""What keeps the window usable on a laptop's 1280×800 screen (issue 37, item 7): forms
that scroll and say how wide they must be, the left column's width kept as the user set
it, and plots that leave the mouse wheel to the page."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QGraphicsScene,
    QGraphicsView,
    QScrollArea,
    QSplitter,
    QStyle,
    QWidget,
)

#: the smallest screen every tab must fit (a 13-inch laptop), logical px
LAPTOP_SCREEN = (1280, 800)


class FormScrollArea(QScrollArea):
    """A form in a scroll area: it scrolls vertically, never sideways, and its minimum
    width is the form's own (the body's minimum size hint + the vertical scroll bar + the
    frame), so a column or a splitter never narrows it to where its right edge is cut off
    (the Save…, Abort, model browse and GPU count controls, issue 37)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # the form follows the column's width

    def setWidget(self, widget: QWidget) -> None:  # noqa: N802 (Qt's name)
        super().setWidget(widget)
        widget.installEventFilter(self)  # rows shown or hidden: the minimum width follows

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802
        if obj is self.widget() and ev.type() == QEvent.LayoutRequest:
            self.updateGeometry()
        return super().eventFilter(obj, ev)

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        base = super().minimumSizeHint()
        body = self.widget()
        if body is None:
            return base
        bar = self.style().pixelMetric(QStyle.PM_ScrollBarExtent, None, self)
        return QSize(body.minimumSizeHint().width() + bar + 2 * self.frameWidth(), base.height())


class SplitKeeper(QObject):
    """Keeps the first pane of ``splitter`` at the width the user gave it.

    Qt's splitter takes room from the first pane whenever the second needs more (a wide
    tab shown, the window made smaller) and never gives it back: opening Compare at
    1600×1000 narrowed the left form for good (issue 37). Here only a drag of the handle
    by the user (``splitterMoved``) sets the wanted width; a resize of the window or a
    change of tab puts the pane back to it, as far as both panes' minimums allow. The
    wanted width is what :meth:`wanted` returns for saving — never a width Qt forced — and
    :meth:`restore` clamps a saved one to the pane's minimum."""

    def __init__(self, splitter: QSplitter, width: int) -> None:
        super().__init__(splitter)
        self.splitter = splitter
        self.width = width
        self._queued = False
        splitter.setChildrenCollapsible(False)
        splitter.splitterMoved.connect(self._moved)
        splitter.installEventFilter(self)

    def wanted(self) -> int:
        """The first pane's width as the user set it (px)."""
        return self.width

    def restore(self, width: int | None) -> None:
        """Take a saved width (None or nonsense: keep the default), then apply it."""
        try:
            w = int(width) if width is not None else None
        except (TypeError, ValueError):
            w = None
        if w is not None and w > 0:
            self.width = max(w, self._first_min())
        self.apply()

    def _first_min(self) -> int:
        return self.splitter.widget(0).minimumSizeHint().width()

    def _moved(self, pos: int, index: int) -> None:
        if index == 1:
            self.width = max(self.splitter.sizes()[0], self._first_min())

    def apply(self) -> None:
        """Give the first pane the wanted width, or what the second pane's minimum leaves."""
        sizes = self.splitter.sizes()
        total = sum(sizes)
        if len(sizes) != 2 or total <= 0:
            return
        second_min = self.splitter.widget(1).minimumSizeHint().width()
        first = max(self._first_min(), min(self.width, total - second_min))
        if first != sizes[0]:
            self.splitter.setSizes([first, total - first])

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802
        # after the splitter has handled the event (it shares the room out first)
        if obj is self.splitter and ev.type() in (QEvent.Resize, QEvent.LayoutRequest, QEvent.Show) \
                and not self._queued:
            self._queued = True
            QTimer.singleShot(0, self, self._apply_queued)
        return False

    def _apply_queued(self) -> None:
        self._queued = False
        self.apply()


class WheelToPage(QObject):
    """The mouse wheel over a plot scrolls the page it is on (issue 37: over a Plan plot it
    zoomed the axes to absurd ranges instead). The plot zooms only while it has the
    keyboard focus (a click in it, or Tab) or with Ctrl held; otherwise the wheel event
    goes to the scroll bar of the nearest scroll area around the plot (none: the wheel
    does nothing there). Installed on the plot's viewport by :func:`plot_view`."""

    def __init__(self, view: QWidget) -> None:
        super().__init__(view)
        self.view = view

    def page(self) -> QScrollArea | None:
        """The nearest scroll area the plot is in (None: none)."""
        w = self.view.parentWidget()
        while w is not None and not isinstance(w, QScrollArea):
            w = w.parentWidget()
        return w

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802
        if ev.type() != QEvent.Wheel or ev.modifiers() & Qt.ControlModifier or self.view.hasFocus():
            return False
        page = self.page()
        if page is not None:  # a copy: Qt does not pass a wheel event it did not make itself on to the parents
            bar = page.verticalScrollBar()
            QApplication.sendEvent(bar, QWheelEvent(ev.position(), ev.globalPosition(), ev.pixelDelta(),
                                                    ev.angleDelta(), ev.buttons(), ev.modifiers(), ev.phase(),
                                                    ev.inverted()))
        return True


def plot_view(view: QGraphicsView) -> QGraphicsView:
    """Every plot of the window is made through here (tests/integration/test_gui_fit.py names
    one that is not); returns ``view`` (a pyqtgraph GraphicsView: PlotWidget,
    GraphicsLayoutWidget) with

    - the wheel rule of :class:`WheelToPage` (the page scrolls; the plot zooms with the focus
      or Ctrl);
    - its scene unindexed (``QGraphicsScene.NoIndex``): Qt's default BSP-tree index is for
      static scenes (Qt's QGraphicsScene::ItemIndexMethod documentation: NoIndex suits
      dynamic scenes, where items move), and a plot's legends and curves move. Tried first
      against a crash at a view's deletion (SIGSEGV in ~QGraphicsWidget); it did not stop
      it alone (widgets.axes.KeptLegend, tests/plugins/qt.py).
      A plot's scene holds tens of items: the linear search costs nothing there."""
    view.setFocusPolicy(Qt.StrongFocus)  # a click or Tab gives the plot the focus, the wheel alone does not
    view.wheel_to_page = WheelToPage(view)  # type: ignore[attr-defined]
    view.viewport().installEventFilter(view.wheel_to_page)  # type: ignore[attr-defined]
    view.scene().setItemIndexMethod(QGraphicsScene.ItemIndexMethod.NoIndex)
    return view


#: characters a narrowed combo box still shows (it elides the rest; the list pops up whole)
COMBO_MIN_CHARS = 6


def narrow_combos(root: QWidget, chars: int = COMBO_MIN_CHARS) -> None:
    """Every combo box under ``root`` asks for room for ``chars`` characters, not for its
    longest entry: a run name, a profile name or a model id in a combo box made its tab
    (Compare: the what-if's run) or the form wider than a laptop's screen (issue 37)."""
    for combo in root.findChildren(QComboBox):
        combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        combo.setMinimumContentsLength(chars)
