"""Live progress of a matrix run: which cell, which step, how long.

On a terminal one status line is redrawn every half second; elsewhere (CI logs, pipes) each
change is a plain line of its own.  Finished cells always get a permanent line.
"""
import sys
import threading
import time

__all__ = ["Progress", "clock_text"]


def clock_text(seconds):
    """``m:ss`` (or ``h:mm:ss``)."""
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Progress display.

    Parameters
    ----------
    stream : file
        Where to write (default ``sys.stderr``).
    live : bool, optional
        Redraw a status line in place; default: whether ``stream`` is a terminal.
    clock : callable
        Seconds, monotonic (tests pass a fake).
    """

    def __init__(self, stream=None, *, live=None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.clock = clock
        self.total = 0
        self.index = 0
        self.cell = None
        self.step_name = None
        self.run_start = self.cell_start = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def _status(self):
        now = self.clock()
        return (f"[{self.index}/{self.total}] {self.cell} · {self.step_name} · "
                f"{clock_text(now - self.cell_start)} (total {clock_text(now - self.run_start)})")

    def _write(self, text, permanent):
        with self._lock:
            if self.live:
                self.stream.write("\r\033[K" + text + ("\n" if permanent else ""))
            elif permanent:
                self.stream.write(text + "\n")
            self.stream.flush()

    def _tick(self):
        while not self._stop.wait(0.5):
            if self.cell is not None:
                self._write(self._status(), permanent=False)

    def start(self, total):
        self.total = total
        self.run_start = self.clock()
        if self.live and self._thread is None:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def start_cell(self, index, name):
        self.index, self.cell, self.step_name = index, name, "setup"
        self.cell_start = self.clock()
        self._write(self._status(), permanent=not self.live)

    def step(self, name):
        self.step_name = name
        self._write(self._status(), permanent=not self.live)

    def finish_cell(self, status, detail=""):
        elapsed = clock_text(self.clock() - self.cell_start)
        line = f"[{self.index}/{self.total}] {self.cell}: {status}"
        line += f" ({detail})" if detail else ""
        self.cell = None
        self._write(f"{line} in {elapsed}", permanent=True)

    def message(self, text):
        """A permanent line between cells (log tails, notes)."""
        self._write(text, permanent=True)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
