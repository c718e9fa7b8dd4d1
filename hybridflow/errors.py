"""User-facing errors.

Every mistake a user can make (a misspelled key, a missing column, an unreadable file)
raises a subclass of :class:`HybridflowError` whose message names the fix. The entry
points print such errors as one line without a traceback (set ``HYBRIDFLOW_DEBUG=1``
or pass ``--debug`` to see it); any other exception is a bug and keeps its traceback.
"""


class HybridflowError(Exception):
    """An error caused by user input; its message says what to change."""


class ConfigError(HybridflowError):
    """A bad configuration key, value or combination of values."""


class DataError(HybridflowError):
    """A data file or row that cannot be used."""


class ModelError(HybridflowError):
    """A model path or model file that cannot be loaded."""


class CheckpointError(HybridflowError):
    """A checkpoint that cannot be written (disk full, I/O error) or read back (damaged)."""


class WorkerDiedError(HybridflowError):
    """A worker process exited during a call; the run must resume from its last checkpoint."""


class RolloutError(HybridflowError):
    """Bad input to the generation engine (prompt too long, max_tokens <= 0, ...)."""


def debug_enabled(argv: list[str] | None = None) -> bool:
    """``--debug`` on the command line or ``HYBRIDFLOW_DEBUG=1`` shows full tracebacks."""
    import os

    return os.environ.get("HYBRIDFLOW_DEBUG", "") not in ("", "0") or "--debug" in (argv or [])


def run_entry_point(main, argv: list[str]) -> int:
    """Run ``main(argv)``; a HybridflowError becomes one line on stderr and exit code 2."""
    import sys

    debug = debug_enabled(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        return main(argv) or 0
    except HybridflowError as err:
        if debug:
            raise
        for line in str(err).splitlines():
            print(f"hybridflow: error: {line}", file=sys.stderr)
        return 2
