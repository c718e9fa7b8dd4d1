"""KL coefficient controllers for the in-reward KL penalty (``algorithm.kl_ctrl``).

Ziegler et al., "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593),
section 2.2: the adaptive controller steers the measured KL towards ``target_kl``::

    e_t  = clip(KL_t / KL_target - 1, -0.2, 0.2)
    beta <- beta * (1 + e_t * n_steps / horizon)
"""

from __future__ import annotations

from hybridflow.algos.errors import AlgorithmError

_MAX_PROPORTIONAL_ERROR = 0.2


class FixedKLController:
    """A constant coefficient ``value``; ``update`` does nothing."""

    def __init__(self, *, kl_coef: float):
        self.value = kl_coef

    def update(self, *, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps


class AdaptiveKLController:
    """Proportional controller of ``value`` towards ``target_kl`` (equation above)."""

    def __init__(self, *, init_kl_coef: float, target_kl: float, horizon: float):
        if target_kl <= 0 or horizon <= 0:
            raise AlgorithmError(
                f"adaptive KL needs target_kl > 0 and horizon > 0 (got {target_kl}, {horizon}); "
                "set algorithm.kl_ctrl.target_kl / horizon or use kl_ctrl.type=fixed"
            )
        self.value = init_kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, *, current_kl: float, n_steps: int) -> None:
        """Move ``value`` after ``n_steps`` samples whose mean KL was ``current_kl``."""
        error = current_kl / self.target_kl - 1
        error = min(max(error, -_MAX_PROPORTIONAL_ERROR), _MAX_PROPORTIONAL_ERROR)
        self.value *= 1 + error * n_steps / self.horizon


KL_CONTROLLERS = {
    "fixed": lambda *, kl_coef, target_kl, horizon: FixedKLController(kl_coef=kl_coef),
    "adaptive": lambda *, kl_coef, target_kl, horizon: AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl,
                                                                             horizon=horizon),
}
"""``algorithm.kl_ctrl.type`` -> its controller's builder."""


def build_kl_controller(kind: str, *, kl_coef: float, target_kl: float, horizon: float):
    """The controller ``algorithm.kl_ctrl.type`` names, fixed or adaptive (Ziegler et al. 2019)."""
    if kind not in KL_CONTROLLERS:
        raise AlgorithmError(f"algorithm.kl_ctrl.type={kind!r} is not one of {', '.join(KL_CONTROLLERS)}")
    return KL_CONTROLLERS[kind](kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)

