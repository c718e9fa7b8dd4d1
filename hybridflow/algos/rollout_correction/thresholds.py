"""Parsing of verl's rollout-correction threshold specs (``rollout_is_threshold``, ``rollout_rs_threshold``).

A spec is a number or a string: ``2.0`` / ``"2.0"`` is an upper bound, ``"0.5_2.0"`` a
``lower_upper`` pair; ``rollout_rs_threshold`` may list one spec per ``rollout_rs``
option, comma separated (``"0.5_2.0,0.01"``), or one spec shared by all.
"""

from __future__ import annotations

from hybridflow.algos.errors import AlgorithmError


def _positive(text: str, *, what: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise AlgorithmError(f"{what}: {text!r} is not a number; write e.g. 2.0 or 0.5_2.0") from err
    if value <= 0:
        raise AlgorithmError(f"{what}: bounds must be positive, got {value}")
    return value


def parse_bounds(spec, *, what: str) -> tuple[float | None, float]:
    """``(lower or None, upper)`` from ``2.0``, ``"2.0"`` or ``"0.5_2.0"``."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise AlgorithmError(f"{what} must be a number or a 'lower_upper' string, got {spec!r}")
    text = str(spec).strip()
    if "_" not in text:
        return None, _positive(text, what=what)
    lower_text, upper_text = text.split("_", 1)
    lower, upper = _positive(lower_text, what=what), _positive(upper_text, what=what)
    if lower > upper:
        raise AlgorithmError(f"{what}: lower bound {lower} is above upper bound {upper}")
    return lower, upper


def parse_rs_thresholds(*, options: list[str], spec) -> dict[str, tuple[float | None, float]]:
    """Per rejection option, ``(lower, upper)``: k1 options get ``lower = 1/upper`` when only
    an upper ratio bound is given; the others take a single upper bound."""
    if spec is None:
        raise AlgorithmError("algorithm.rollout_correction.rollout_rs is set but rollout_rs_threshold is not; "
                             "give one threshold (or one per option, comma separated)")
    specs = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise AlgorithmError(f"rollout_rs_threshold has {len(specs)} entries for {len(options)} rollout_rs options; "
                             "give one shared threshold or one per option")
    bounds = {}
    for option, text in zip(options, specs):
        what = f"rollout_rs_threshold for {option}"
        lower, upper = parse_bounds(text, what=what)
        if option.endswith("k1"):
            lower = 1.0 / upper if lower is None else lower
            if lower > upper:
                raise AlgorithmError(f"{what}: a single k1 bound U means [1/U, U], so U must be >= 1 (got {upper}); "
                                     "or give 'lower_upper'")
        elif lower is not None:
            raise AlgorithmError(f"{what}: {option} takes a single upper bound, not 'lower_upper' ({text!r})")
        bounds[option] = (lower, upper)
    return bounds
