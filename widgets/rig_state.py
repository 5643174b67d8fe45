"""The truth the window's panels share: the server configuration the form describes and
the plan made for it, in one model object that emits change events.

The form (``ConfigPanel``) writes the configuration here and shows it again when
something else changes it (Apply fix); the plan panel, the Curves tab, the parallel-size
choices of the form and the window's controls listen to :attr:`RigState.plan_changed`.
Nothing else keeps a copy of the configuration or the plan.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from app.config import ServerConfig


class RigState(QObject):
    """``config``: the ServerConfig of the form (None while the form does not validate:
    ``config_error`` says why). ``plan``: the planner's Plan for it (None: ``plan_error``
    ``(message, form_error)`` or ``message`` says why). Signals: ``config_changed(object)``
    (the new ServerConfig or None) and ``plan_changed()``."""

    config_changed = Signal(object)
    plan_changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.config: ServerConfig | None = None
        self.config_error: str | None = None
        self.plan: Any = None
        self.plan_error: tuple[str, bool] | None = None
        self.message: str | None = None

    def set_config(self, cfg: ServerConfig) -> None:
        """A new configuration (the form's, or a fix applied to it); emits only on change."""
        if cfg == self.config and self.config_error is None:
            return
        self.config, self.config_error = cfg, None
        self.config_changed.emit(cfg)

    def set_config_error(self, message: str) -> None:
        """The form does not validate (``message`` names the field)."""
        if self.config is None and self.config_error == message:
            return
        self.config, self.config_error = None, message
        self.config_changed.emit(None)

    def set_plan(self, plan: Any) -> None:
        self.plan, self.plan_error, self.message = plan, None, None
        self.plan_changed.emit()

    def set_plan_error(self, message: str, form_error: bool) -> None:
        """No plan: the form is wrong (``form_error``) or the planner cannot plan."""
        self.plan, self.plan_error, self.message = None, (message, form_error), None
        self.plan_changed.emit()

    def clear_plan(self, message: str) -> None:
        """No plan, and none expected (an attached server): ``message`` says so."""
        self.plan, self.plan_error, self.message = None, None, message
        self.plan_changed.emit()
