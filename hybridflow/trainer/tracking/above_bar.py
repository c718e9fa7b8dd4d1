"""Console lines above the progress bar: while the training bar is drawn, ``sys.stdout`` and ``sys.stderr`` are
streams that clear the bar, write whole lines, and draw the bar again (tqdm's ``external_write_mode``).

Why: the bar is a line without its newline, redrawn in place; a warning written to the same terminal lands glued
to its end (``training:  50%|#####     | 1/2 [...]no KV block is left ...``), where a reader or a log filter
matching at the start of a line misses it. Every console message of a run goes through these two streams:
``logging`` (the last-resort handler looks them up when it writes; handlers that hold them get the wrapped ones),
``warnings.warn`` (``showwarning`` writes to ``sys.stderr``) and ``print``, from any thread (tqdm's lock orders
the clears and redraws; these streams take it too). A write is held until its line is complete, so ``print``'s
text and its newline (two writes) never have the bar drawn between them. What a tqdm bar draws (another bar drawn
while this one is, such as a checkpoint's "Writing model shards") goes through as it comes.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from tqdm import tqdm


class LinesAboveBar:
    """A text stream over ``stream`` that writes complete lines with the progress bars cleared."""

    def __init__(self, stream):
        self.stream = stream
        self._partial = ""

    def write(self, text: str) -> int:
        if _drawn_by_a_bar():
            return self.stream.write(text)
        with tqdm.get_lock():  # tqdm's (reentrant) lock, taken first as tqdm.write takes it: one lock order
            head, newline, self._partial = (self._partial + text).rpartition("\n")
            if newline:
                self._write_above(head + newline)
        return len(text)

    def flush(self) -> None:
        """Write a pending partial line too (a prompt, a progress dot), then flush the stream; a bar's flush
        (tqdm holds its lock then) only flushes the stream."""
        if not _drawn_by_a_bar():
            with tqdm.get_lock():
                pending, self._partial = self._partial, ""
                if pending:
                    self._write_above(pending + "\n")
        self.stream.flush()

    def _write_above(self, lines: str) -> None:
        # A terminal shows the cleared bar line as empty; in a file (a log) the bar's text stays on its line, so
        # the message starts a line of its own after it, for a filter that reads the log line by line.
        start = "" if self.stream.isatty() else "\n"
        with tqdm.external_write_mode(file=self.stream, nolock=True):
            self.stream.write(start + lines)
            self.stream.flush()

    def __eq__(self, other) -> bool:
        """Equal to the stream it wraps: tqdm clears a bar before an outside write when the two files compare
        equal (a bar drawn on the real stderr, ``tqdm.write`` to this one)."""
        return other is self or other == self.stream

    __hash__ = object.__hash__

    def __getattr__(self, name):  # fileno, isatty, encoding, ... of the real stream
        return getattr(self.stream, name)


def _drawn_by_a_bar() -> bool:
    """Whether the caller of :meth:`LinesAboveBar.write` / ``flush`` is a tqdm bar drawing itself (every bar
    writes through tqdm's file wrapper in ``tqdm.utils``); ``tqdm.write``'s lines are lines like any other."""
    return sys._getframe(2).f_globals.get("__name__") == "tqdm.utils"


@contextlib.contextmanager
def console_above_bar() -> Iterator[None]:
    """``sys.stdout`` / ``sys.stderr`` write above the bar for the block's duration, and so do the logging
    handlers that hold them (``logging.basicConfig``'s, transformers' own, set up before the bar); all are
    restored afterwards (pending partial lines written)."""
    real = sys.stdout, sys.stderr
    wrapped = {id(stream): LinesAboveBar(stream) for stream in real}
    held = [(handler, handler.stream) for handler in _console_handlers() if id(handler.stream) in wrapped]
    sys.stdout, sys.stderr = (wrapped[id(stream)] for stream in real)
    for handler, stream in held:
        handler.setStream(wrapped[id(stream)])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = real
        for handler, stream in held:
            handler.setStream(stream)
        for stream in wrapped.values():
            stream.flush()


def _console_handlers() -> list[logging.StreamHandler]:
    """Every logging handler that writes to a stream it holds (files aside), on the root logger and the named
    ones."""
    loggers = [logging.getLogger(), *(each for each in logging.Logger.manager.loggerDict.values()
                                      if isinstance(each, logging.Logger))]
    handlers = {id(h): h for each in loggers for h in each.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)}
    return list(handlers.values())
