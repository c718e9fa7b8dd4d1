"""Name -> function registries for advantage estimators and policy losses.

Trainers look algorithms up by their verl config names
(``algorithm.adv_estimator=grpo``, ``actor.policy_loss.loss_mode=vanilla``) instead of
branching on them, and users add their own with the same decorators::

    @register_advantage("my_estimator")
    def my_estimator(*, token_level_rewards, response_mask, index, **_):
        ...

Every advantage estimator is called with the same keyword arguments and ignores the
ones it does not read (hence the ``**_``)::

    fn(*, token_level_rewards [B, T], response_mask [B, T], index (len B),
       values=None [B, T], gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True,
       reward_baselines=None [B], old_log_probs=None [B, T], sum_pi_squared=None [B, T],
       rollout_is_weights=None [B, T], reward_components=None {name: [B]},
       reward_weights=None, prm_rewards=None [B, T], reward_dpo_coef=5.0, reward_gt_coef=5.0,
       epsilon=1e-6) -> (advantages [B, T], returns [B, T])

=============================  ==========================================================
estimator                      reads (besides token_level_rewards, response_mask)
=============================  ==========================================================
gae                            values, gamma, lam
grpo, grpo_vectorized          index, norm_adv_by_std_in_grpo, epsilon
grpo_passk                     index, norm_adv_by_std_in_grpo, epsilon
gdpo                           index, reward_components, reward_weights,
                               norm_adv_by_std_in_grpo, epsilon
optimal_token_baseline,        index, old_log_probs, sum_pi_squared,
tir_optimal_token_baseline     rollout_is_weights
rloo, rloo_vectorized, opo,    index
reinforce_plus_plus_baseline   index
gpg                            index
remax                          reward_baselines
reinforce_plus_plus            gamma
prime                          index, prm_rewards, reward_dpo_coef, reward_gt_coef
=============================  ==========================================================

An estimator declares what the loop must provide for it when it registers, and the loop,
validation and the role builders ask :func:`advantage_spec` instead of comparing names::

    @register_advantage("gae", needs_values=True)              # the critic runs
    @register_advantage("remax", needs_greedy_baseline=True)   # a greedy rollout per prompt
    @register_advantage("prime", needs_implicit_prm=True)      # the implicit PRM is built and trained

Every policy loss is called as::

    fn(*, old_log_prob [B, T], log_prob [B, T], advantages [B, T], response_mask [B, T],
       loss_agg_mode="token-mean", clip_ratio=0.2, clip_ratio_low=None,
       clip_ratio_high=None, clip_ratio_c=3.0, global_num_tokens=None,
       global_num_seqs=None, max_response_length=None, rollout_is_weights=None [B, T],
       **mode_specific)
       -> (loss scalar, metrics dict[str, float])
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from hybridflow.algos.errors import AlgorithmError, UnknownAlgorithmError


def _qualified(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


class Registry:
    """A named table of functions with a helpful error for unknown names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def decorator(fn: Callable) -> Callable:
            existing = self._fns.get(name)
            # Re-registering the same function (a module reload) is harmless; a different
            # function under a taken name would silently change what a config means.
            if existing is not None and _qualified(existing) != _qualified(fn):
                raise AlgorithmError(
                    f"{self.kind} {name!r} is already registered by {existing.__module__}; pick another name"
                )
            self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        if name not in self._fns:
            close = difflib.get_close_matches(name, self._fns, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownAlgorithmError(
                f"unknown {self.kind} {name!r}{hint}; registered: {', '.join(self.names())}"
            )
        return self._fns[name]

    def names(self) -> list[str]:
        return sorted(self._fns)


@dataclass(frozen=True)
class AdvantageSpec:
    """What an advantage estimator needs besides rewards, mask and group index."""

    needs_values: bool = False
    """Critic values ``[B, T]``: the critic is built and trained (``critic.enable`` null means this)."""
    needs_greedy_baseline: bool = False
    """``reward_baselines [B]``: the reward of one greedy response per prompt, generated every step."""
    needs_implicit_prm: bool = False
    """``prm_rewards [B, T]``: PRIME's implicit process reward model is built, trained on the outcome labels every
    step, and its dense rewards ``beta * log(pi_phi / pi_ref)`` computed (needs the reference's log-probs)."""


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
_ADVANTAGE_SPECS: dict[str, AdvantageSpec] = {}


def register_advantage(name: str, *, needs_values: bool = False, needs_greedy_baseline: bool = False,
                       needs_implicit_prm: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``algorithm.adv_estimator=name``, with what it needs."""
    register = ADVANTAGES.register(name)

    def decorator(fn: Callable) -> Callable:
        fn = register(fn)  # raises before the spec changes when the name is taken by another function
        _ADVANTAGE_SPECS[name] = AdvantageSpec(needs_values=needs_values, needs_greedy_baseline=needs_greedy_baseline,
                                               needs_implicit_prm=needs_implicit_prm)
        return fn

    return decorator


def advantage_spec(name: str | None) -> AdvantageSpec:
    """What the estimator registered as ``name`` needs (an unknown name raises with the registered ones);
    ``None`` (a trainer without an estimator: SPIN, SPPO) needs nothing."""
    if name is None:
        return AdvantageSpec()
    ADVANTAGES.get(name)
    return _ADVANTAGE_SPECS[name]


def get_advantage(name: str) -> Callable:
    """The advantage estimator registered as ``name``."""
    return ADVANTAGES.get(name)


def list_advantages() -> list[str]:
    return ADVANTAGES.names()


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``actor.policy_loss.loss_mode=name``."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as ``name``."""
    return POLICY_LOSSES.get(name)


def list_policy_losses() -> list[str]:
    return POLICY_LOSSES.names()
