"""Console lines above the progress bar: while the training bar is drawn, ``sys.stdout`` and ``sys.stderr`` are
streams that clear the bar, write whole lines, and draw the bar again (tqdm's ``external_write_mode``).

Why: the bar is a line without its newline, redrawn in place; a warning written to the same terminal lands glued
to its end (``training:  50%|#####     | 1/2 [...]no KV block is left ...``), where a reader or a log filter
matching at the start of a line misses it. Every console message of a run goes through these two streams:
``logging`` (the last-resort handler and any handler that writes to them look them up when they write),
``warnings.warn`` (``showwarning`` writes to ``sys.stderr``) and ``print``, from any thread (tqdm's lock orders
the clears and redraws). A write is held until its line is complete, so ``print``'s text and its newline (two
writes) never have the bar drawn between them.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from tqdm import tqdm


class LinesAboveBar:
    """A text stream over ``stream`` that writes complete lines with the progress bars cleared."""

    def __init__(self, stream):
        self.stream = stream
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            head, newline, self._partial = (self._partial + text).rpartition("\n")
            if newline:
                self._write_above(head + newline)
        return len(text)

    def flush(self) -> None:
        """Write a pending partial line too (a prompt, a progress dot), then flush the stream."""
        with self._lock:
            pending, self._partial = self._partial, ""
            if pending:
                self._write_above(pending + "\n")
        self.stream.flush()

    def _write_above(self, lines: str) -> None:
        # A terminal shows the cleared bar line as empty; in a file (a log) the bar's text stays on its line, so
        # the message starts a line of its own after it, for a filter that reads the log line by line.
        start = "" if self.stream.isatty() else "\n"
        with tqdm.external_write_mode(file=self.stream):
            self.stream.write(start + lines)
            self.stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, ... of the real stream
        return getattr(self.stream, name)


@contextlib.contextmanager
def console_above_bar() -> Iterator[None]:
    """``sys.stdout`` / ``sys.stderr`` write above the bar for the block's duration, then are restored (their
    pending partial lines written)."""
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = LinesAboveBar(real[0]), LinesAboveBar(real[1])
    try:
        yield
    finally:
        wrapped, (sys.stdout, sys.stderr) = (sys.stdout, sys.stderr), real
        for stream in wrapped:
            if isinstance(stream, LinesAboveBar):
                stream.flush()
