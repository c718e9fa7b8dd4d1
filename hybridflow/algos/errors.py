"""Errors raised by the algorithm library.

``algos`` imports only torch, numpy and the base ``hybridflow/errors.py`` (see DESIGN.md). These are user errors
(:class:`hybridflow.errors.HybridflowError`, printed by the entry points as one line naming the fix: a negative
clip ratio reaching a policy loss, an unknown estimator name) and ``ValueError`` for callers of the library that
catch that.
"""

from hybridflow.errors import HybridflowError


class AlgorithmError(HybridflowError, ValueError):
    """Inputs that an algorithm cannot use (missing critic values, a bad clip range, ...)."""


class UnknownAlgorithmError(AlgorithmError):
    """A name that is not in a registry; the message lists the registered names."""
