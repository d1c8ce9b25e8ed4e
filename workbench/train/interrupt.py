"""Ctrl-C during training: held while an optimizer update is in progress, never lost."""

from __future__ import annotations

import signal
import threading
from typing import Any


class SigintGuard:
    """For the length of a fit: a Ctrl-C (the notebook stop button) that arrives while ``holding``
    is held until :meth:`release`, so an optimizer update is never cut in half.

    The handler is installed once per fit, not per step (installing one costs more than the rest
    of the loop's bookkeeping); outside the held sections it passes Ctrl-C on to the handler it
    replaced. Only the main thread can receive signals: elsewhere (a background fit) it does nothing.
    """

    def __init__(self):
        self.holding = False
        self.received = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> SigintGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        self.holding = self.received = False
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum, frame) -> None:
        if self.holding:
            self.received = True
        elif callable(self._previous):
            self._previous(signum, frame)
        elif self._previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def release(self) -> None:
        """End the held section; raise the Ctrl-C that arrived during it, now that it is safe."""
        self.holding = False
        if self.received:
            self.received = False
            raise KeyboardInterrupt
