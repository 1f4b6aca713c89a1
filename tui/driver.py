"""The dashboard's terminal driver: Textual's `LinuxDriver`, made safe to leave however the terminal goes.

Textual's driver (8.2) does two things that kept a process alive, or crashed it, after its terminal
was closed:

- It restarts its application mode on every SIGCONT, suspended or not, and its SIGTSTP / SIGCONT
  handlers stay installed after the app. A closed terminal sends its session's leader SIGCONT along
  with SIGHUP; one that came while the app was closing started a new input thread that nothing
  stopped, and that (non-daemon) thread then held the interpreter's shutdown for good. One that
  came after the app raised `RuntimeError` into whatever ran then. `TerminalDriver` resumes only
  what it suspended itself (Ctrl+Z, `App.suspend`); `run_app` puts the handlers back after the app.
- Its writer thread dies on the first write that fails (EIO once the terminal is gone, EPIPE), and
  the app then blocks for good on the full output queue. `TerminalDriver` writes through `_Output`,
  which on the first failure points stdout and stderr at /dev/null, drops what follows and asks the
  app to exit as after a hangup (`TerminalGone`, exit code 128 + SIGHUP); so does a read of the
  input that fails.
"""

from __future__ import annotations

import logging
from typing import IO, Callable

from textual.drivers.linux_driver import LinuxDriver

from p2p_diloco.terminal import leave_terminal
from p2p_diloco.tui.messages import TerminalGone

logger = logging.getLogger(__name__)


class _Output:
    """What Textual's writer thread writes to: the terminal until a write to it fails, then nothing."""

    def __init__(self, file: IO[str], on_gone: Callable[[], None]) -> None:
        self._file = file
        self._on_gone = on_gone
        self.gone = False

    def write(self, text: str) -> None:
        if not self.gone:
            try:
                self._file.write(text)
            except OSError as e:
                self._lost(e)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except OSError as e:
                self._lost(e)

    def fileno(self) -> int:
        return self._file.fileno()

    def _lost(self, error: OSError) -> None:
        self.gone = True
        leave_terminal()  # what is still buffered, and the last lines of whoever writes next, go nowhere
        logger.info("the terminal is gone (%s); the dashboard closes", error)
        self._on_gone()


class TerminalDriver(LinuxDriver):
    """`LinuxDriver` that leaves cleanly when its terminal is closed (see the module docstring)."""

    def __init__(self, app, **options) -> None:
        super().__init__(app, **options)
        self._dashboard = app
        self._suspended = False
        self._file = _Output(self._file, self._terminal_gone)

    def _terminal_gone(self) -> None:
        try:
            self._dashboard.post_message(TerminalGone())
        except Exception:  # the app's loop is already closed: it is leaving anyway
            logger.debug("the app did not take TerminalGone", exc_info=True)

    def suspend_application_mode(self) -> None:
        super().suspend_application_mode()
        self._suspended = True

    def resume_application_mode(self) -> None:
        if self._suspended:  # not on a SIGCONT alone: a hangup's, or one sent to a running app
            self._suspended = False
            super().resume_application_mode()

    def run_input_thread(self) -> None:
        try:
            super().run_input_thread()
        except OSError as e:  # EIO: the terminal is gone
            logger.info("reading the terminal failed (%s); the dashboard closes", e)
            self._terminal_gone()
