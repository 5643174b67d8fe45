"""The profile manager: list (built-ins read-only, user profiles), new, save, save as,
rename, delete, import (a pasted ``vllm serve`` line, a ``--config`` YAML or a profile
file) and export (command line, ``--config`` YAML, profile YAML).

Presentation only: storage and conversions are app.profiles (ProfileLibrary,
import_text, to_command_line, to_vllm_config_yaml, dump_profile). The form's settings
come from ``form_profile_fn(name, base) → Profile`` (the main window's forms). Every
action has a method that takes its inputs as arguments (tests, scripts); the buttons
only ask for them (dialogs) and report errors in a message box.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.profiles import (
    Profile,
    ProfileError,
    ProfileLibrary,
    dump_profile,
    import_text,
    slugify,
    to_command_line,
    to_vllm_config_yaml,
)
from app.profiles.io import read_text_limited, write_atomic
from widgets.button_bar import button_bar

#: export formats: key → (label, file filter, suffix)
EXPORTS = {"cmd": ("vllm serve command line", "Shell script (*.sh);;All files (*)", ".sh"),
           "yaml": ("vLLM --config YAML", "YAML (*.yaml *.yml);;All files (*)", ".yaml"),
           "profile": ("vLLM Dyno profile YAML", "YAML (*.yaml *.yml);;All files (*)", ".yaml")}


def export_text(profile: Profile, fmt: str) -> str:
    """``profile`` as ``cmd`` (one shell line), ``yaml`` (a ``vllm serve --config`` file)
    or ``profile`` (the profile file). Raises ValueError for another format."""
    if fmt == "cmd":
        return to_command_line(profile) + "\n"
    if fmt == "yaml":
        return to_vllm_config_yaml(profile)
    if fmt == "profile":
        return dump_profile(profile)
    raise ValueError(f"export format {fmt!r}: use one of {', '.join(EXPORTS)}")


class ImportDialog(QDialog):
    """Paste a ``vllm serve`` line or YAML, or pick a file; give the profile a name."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Import profile")
        self.resize(640, 360)
        v = QVBoxLayout(self)
        v.addWidget(QLabel("Paste a <code>vllm serve …</code> command line or a vLLM <code>--config</code> YAML "
                           "(or a vLLM Dyno profile), or open a file:"))
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText("NCCL_P2P_DISABLE=1 vllm serve Qwen/Qwen2.5-7B-Instruct --max-num-seqs 64 …")
        v.addWidget(self.text, 1)
        row = QHBoxLayout()
        open_btn = QPushButton("Open file…")
        open_btn.clicked.connect(self._open)
        row.addWidget(open_btn)
        row.addWidget(QLabel("Name"))
        self.name = QLineEdit()
        self.name.setPlaceholderText("default: the model's name")
        row.addWidget(self.name, 1)
        v.addLayout(row)
        bb = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        bb.accepted.connect(self.accept)
        bb.rejected.connect(self.reject)
        v.addWidget(bb)
        self.label = "<pasted>"

    def _open(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import", "", "YAML or text (*.yaml *.yml *.sh *.txt);;All (*)")
        if path:
            try:
                self.text.setPlainText(read_text_limited(Path(path)))
                self.label = path
            except ProfileError as e:
                QMessageBox.warning(self, "Import", str(e))


class ProfileManager(QWidget):
    """Signals: ``use_requested(name)`` (load it into the form), ``profiles_changed(name)``
    after a save/rename/delete/import (``name``: the profile to show, or "")."""

    use_requested = Signal(str)
    profiles_changed = Signal(str)

    def __init__(self, form_profile_fn: Callable[[str, Profile | None], Profile],
                 library_fn: Callable[[], ProfileLibrary] = ProfileLibrary, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.form_profile_fn = form_profile_fn
        self.library_fn = library_fn
        self.entries: dict[str, object] = {}
        self.errors: list[ProfileError] = []
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        bar, self.buttons = button_bar(self, "profile", (
                ("use", "Use", "Load the selected profile into the form"),
                ("new", "New…", "A new profile from the form's settings (no results, no notes)"),
                ("save", "Save", "Save the form's settings into the selected profile (a built-in gets a user copy)"),
                ("save_as", "Save as…", "Save the form's settings under a new name"),
                ("rename", "Rename…", "Rename the selected user profile"),
                ("delete", "Delete", "Delete the selected user profile"),
                ("import", "Import…", "From a vllm serve command line, a --config YAML or a profile file"),
                ("export", "Export…", "As a vllm serve command line, a --config YAML or a profile file")))
        v.addLayout(bar)
        split = QSplitter(Qt.Horizontal)
        self.list = QListWidget()
        self.list.currentItemChanged.connect(lambda *_: self._show_selected())
        self.list.itemDoubleClicked.connect(lambda it: self.use_requested.emit(it.data(Qt.UserRole)))
        split.addWidget(self.list)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        self.title = QLabel()
        self.title.setWordWrap(True)
        self.title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        rv.addWidget(self.title)
        self.results = QLabel()
        self.results.setWordWrap(True)
        self.results.setTextInteractionFlags(Qt.TextSelectableByMouse)
        rv.addWidget(self.results)
        frow = QHBoxLayout()
        frow.addWidget(QLabel("Show as"))
        self.fmt = QComboBox()
        for key, (label, _, _) in EXPORTS.items():
            self.fmt.addItem(label, key)
        self.fmt.setCurrentIndex(2)
        self.fmt.currentIndexChanged.connect(lambda *_: self._show_selected())
        frow.addWidget(self.fmt, 1)
        copy = QPushButton("Copy")
        copy.setToolTip("Copy the text below")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.preview.toPlainText()))
        frow.addWidget(copy)
        rv.addLayout(frow)
        self.preview = QPlainTextEdit()
        self.preview.setReadOnly(True)
        self.preview.setFont(QFont("monospace"))
        self.preview.setLineWrapMode(QPlainTextEdit.NoWrap)
        rv.addWidget(self.preview, 1)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color:#a61b1b")
        rv.addWidget(self.error_label)
        split.addWidget(right)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([380, 620])
        v.addWidget(split, 1)
        self._loaded = False

    def showEvent(self, ev) -> None:  # scan on first show (no file I/O while the window opens)
        if not self._loaded:
            self.refresh()
        super().showEvent(ev)

    # ------------------------------------------------------------------ list
    def library(self) -> ProfileLibrary:
        return self.library_fn()

    def refresh(self, select: str | None = None) -> None:
        """Rescan the library; select ``select`` (default: keep the selection)."""
        self._loaded = True
        keep = select or self.selected_name()
        res = self.library().scan()
        self.entries = {e.name: e for e in res.entries}
        self.errors = res.errors
        self.list.blockSignals(True)
        self.list.clear()
        for e in res.entries:
            label = e.name + ("  · built-in" if e.read_only else "  · your copy of a built-in"
                              if e.shadows_builtin else "")
            it = QListWidgetItem(label)
            it.setData(Qt.UserRole, e.name)
            it.setToolTip(("Built-in, read-only: saving it makes a user copy\n" if e.read_only else "") + str(e.path)
                          + ("\n" + "\n".join(e.warnings) if e.warnings else ""))
            if e.read_only:
                it.setForeground(QBrush(QColor("#555")))
                f = it.font()
                f.setItalic(True)
                it.setFont(f)
            self.list.addItem(it)
            if e.name == keep:
                self.list.setCurrentItem(it)
        self.list.blockSignals(False)
        if self.list.currentItem() is None and self.list.count():
            self.list.setCurrentRow(0)
        self.error_label.setText("\n".join(f"Not loaded: {e}" for e in self.errors))
        self._show_selected()

    def names(self) -> list[str]:
        return [self.list.item(i).data(Qt.UserRole) for i in range(self.list.count())]

    def selected_name(self) -> str | None:
        it = self.list.currentItem()
        return it.data(Qt.UserRole) if it is not None else None

    def select(self, name: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.UserRole) == name:
                self.list.setCurrentRow(i)
                return

    def selected(self):
        n = self.selected_name()
        return self.entries.get(n) if n else None

    def _show_selected(self) -> None:
        e = self.selected()
        ro = e is not None and e.read_only
        for key in ("use", "save", "save_as", "export"):
            self.buttons[key].setEnabled(e is not None)
        self.buttons["rename"].setEnabled(e is not None and not ro)
        self.buttons["delete"].setEnabled(e is not None and not ro)
        self.buttons["delete"].setToolTip("Built-in profiles cannot be deleted" if ro else
                                          "Delete the selected user profile")
        if e is None:
            self.title.setText("No profile selected.")
            self.results.setText("")
            self.preview.setPlainText("")
            return
        p = e.profile
        kind = "built-in (read-only: saving makes a user copy)" if ro else f"user profile · {e.path}"
        desc = f"<br>{p.description}" if p.description else ""
        self.title.setText(f"<b>{p.name}</b> — {p.engine} · {kind}{desc}")
        self.results.setText(_results_text(p))
        try:
            self.preview.setPlainText(export_text(p, self.fmt.currentData()))
        except Exception as ex:  # e.g. a model path variable that cannot be resolved
            self.preview.setPlainText(f"cannot show this form: {ex}")

    # ------------------------------------------------------------------ actions (no dialogs)
    def new_profile(self, name: str) -> Path:
        """Save the form's settings as a new profile ``name`` (fails if it exists)."""
        prof = self.form_profile_fn(name, None)
        path = self.library().save(prof, overwrite=False)
        self._changed(prof.name)
        return path

    def save(self, name: str | None = None) -> Path:
        """Save the form's settings into profile ``name`` (default: the selected one),
        keeping its description, notes and — for unchanged settings — its results."""
        name = name or self.selected_name()
        if not name:
            raise ValueError("select a profile to save into, or use Save as")
        base = self.entries[name].profile if name in self.entries else None
        prof = self.form_profile_fn(name, base)
        path = self.library().save(prof)
        self._changed(prof.name)
        return path

    def save_as(self, new_name: str) -> Path:
        """Save the form's settings under ``new_name`` (never overwrites)."""
        e = self.selected()
        prof = self.form_profile_fn(new_name, e.profile if e is not None else None)
        path = self.library().save(prof, overwrite=False)
        self._changed(prof.name)
        return path

    def rename(self, old: str, new: str) -> Path:
        e = self.entries.get(old)
        if e is not None and e.read_only:
            raise PermissionError(f"{old!r} is a built-in profile: use Save as to make a copy under a new name")
        path = self.library().rename(old, new)
        self._changed(new)
        return path

    def delete(self, name: str) -> Path:
        path = self.library().delete(name)
        self._changed("")
        return path

    def import_profile(self, text: str, name: str | None = None, label: str = "<pasted>") -> Profile:
        """Import ``text`` (command line, ``--config`` YAML or profile) and save it;
        returns the saved profile. Raises ProfileError / FileExistsError."""
        warns: list[str] = []
        prof = import_text(text, name or None, label, warns)
        self.library().save(prof, overwrite=False)
        self._changed(prof.name)
        if warns:
            self.error_label.setText("Imported with warnings: " + "; ".join(warns))
        return prof

    def export(self, name: str, fmt: str, path: str | Path | None = None) -> str:
        """The profile ``name`` as ``fmt`` text; written atomically to ``path`` when given."""
        prof = self.entries[name].profile if name in self.entries else self.library().get(name)
        text = export_text(prof, fmt)
        if path is not None:
            write_atomic(Path(path), text)
        return text

    def _changed(self, name: str) -> None:
        self.refresh(name or None)
        self.profiles_changed.emit(name)

    # ------------------------------------------------------------------ buttons (dialogs)
    def _run(self, title: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # every failure is the user's to read, never a crash
            QMessageBox.warning(self, title, str(e))

    def _ask(self, title: str, label: str, text: str = "") -> str | None:
        name, ok = QInputDialog.getText(self, title, label, text=text)
        return name.strip() if ok and name.strip() else None

    def _on_use(self) -> None:
        if self.selected_name():
            self.use_requested.emit(self.selected_name())

    def _on_new(self) -> None:
        name = self._ask("New profile", "Name of the new profile (from the form's settings):")
        if name:
            self._run("New profile", lambda: self.new_profile(name))

    def _on_save(self) -> None:
        self._run("Save profile", self.save)

    def _on_save_as(self) -> None:
        cur = self.selected_name() or ""
        name = self._ask("Save profile as", "New name:", f"{cur} (copy)" if cur else "")
        if name:
            self._run("Save profile as", lambda: self.save_as(name))

    def _on_rename(self) -> None:
        cur = self.selected_name()
        name = self._ask("Rename profile", "New name:", cur or "") if cur else None
        if name and name != cur:
            self._run("Rename profile", lambda: self.rename(cur, name))

    def _on_delete(self) -> None:
        cur = self.selected_name()
        if cur and QMessageBox.question(self, "Delete profile", f"Delete the profile {cur!r}?") == QMessageBox.Yes:
            self._run("Delete profile", lambda: self.delete(cur))

    def _on_import(self) -> None:
        dlg = ImportDialog(self)
        if dlg.exec():
            text, name, label = dlg.text.toPlainText(), dlg.name.text().strip(), dlg.label
            self._run("Import profile", lambda: self.import_profile(text, name or None, label))

    def _on_export(self) -> None:
        cur = self.selected_name()
        if not cur:
            return
        fmt = self.fmt.currentData()
        label, filt, suffix = EXPORTS[fmt]

        path, _ = QFileDialog.getSaveFileName(self, f"Export as {label}", slugify(cur) + suffix, filt)
        if path:
            self._run("Export profile", lambda: self.export(cur, fmt, path))


def _results_text(p: Profile) -> str:
    r = p.results
    hw = f"Hardware: {p.hardware.describe()}. " if p.hardware else ""
    if r is None or not r.levels:
        return hw + "No results yet: run a ramp and save the run as a profile (History)."
    peak = f"{r.peak_output_tps:,.0f} out tok/s at {r.best_level:g}" if r.peak_output_tps is not None else "–"
    knee = f", knee at {r.knee:g}" if r.knee is not None else ""
    run = f" (run #{r.run_id})" if r.run_id is not None else ""
    return f"{hw}Results{run}: {len(r.levels)} levels, peak {peak}{knee}; status {r.status or '–'}."
