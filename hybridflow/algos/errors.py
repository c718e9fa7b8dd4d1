"""Errors raised by the algorithm library.

``algos`` imports only torch and numpy (see DESIGN.md), so it cannot raise
``hybridflow.errors.ConfigError`` itself. These are ``ValueError`` subclasses whose
message names the fix; the config layer and the trainer turn them into user errors.
"""


class AlgorithmError(ValueError):
    """Inputs that an algorithm cannot use (missing critic values, a bad clip range, ...)."""


class UnknownAlgorithmError(AlgorithmError):
    """A name that is not in a registry; the message lists the registered names."""
