"""Name -> function registries for advantage estimators and policy losses, each with a spec of what it needs.

Trainers look algorithms up by their verl config names
(``algorithm.adv_estimator=grpo``, ``actor.policy_loss.loss_mode=vanilla``) instead of
branching on them, and users add their own with the same decorators.

Every advantage estimator is called with the loop's keyword arguments and ignores the
ones it does not read (hence the ``**_``)::

    fn(*, token_level_rewards [B, T], response_mask [B, T], index (len B),
       values=None [B, T], gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True,
       reward_baselines=None [B], old_log_probs=None [B, T], sum_pi_squared=None [B, T],
       rollout_is_weights=None [B, T], prm_rewards=None [B, T],
       **its own (the spec's knobs and inputs)) -> (advantages [B, T], returns [B, T])

Its spec (``AdvantageSpec``) carries the rest, so the loop, validation and the role builders
ask :func:`advantage_spec` instead of comparing names::

    @register_advantage("gae", needs_values=True)              # the critic runs
    @register_advantage("remax", needs_greedy_baseline=True)   # a greedy rollout per prompt
    @register_advantage("prime", needs_implicit_prm=True, needs_reference=True,
                        knobs={"reward_dpo_coef": "algorithm.reward_dpo_coef", ...})
    @register_advantage("gdpo", knobs={"reward_weights": "algorithm.gdpo_reward_weights"},
                        inputs={"reward_components": reward_components},  # built from the batch's columns
                        check=reward_keys_problems)                         # one line per problem, before loading

Each estimator's module docstring says what it reads; docs/algorithms.md has the table.

A policy loss is ``fn(inputs: PolicyLossInputs, config: <its knobs' dataclass>, agg: LossAggregation)
-> (loss scalar, metrics dict[str, float])`` (``policy_losses/common.py``), registered with its knobs and
where the run config keeps those the actor does not pass to every loss::

    @register_policy_loss("dro", config=DROConfig, knobs={"dro_beta": "actor_rollout_ref.actor.policy_loss.dro_beta"},
                          check=beta_problems)

and the registry hands out the flat keyword call the actor makes::

    loss_fn(*, old_log_prob [B, T], log_prob [B, T], advantages [B, T], response_mask [B, T],
            rollout_is_weights=None [B, T], index=None (group id of each row, len B), loss_agg_mode="token-mean",
            global_num_tokens=None, global_num_seqs=None, max_response_length=None, **knobs) -> (loss, metrics)

(keywords that are no field of the loss's config are ignored, so one call site serves every loss).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

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


Setting = Callable[[str], Any]
"""``setting("algorithm.gdpo_reward_keys")``: a run-config value by its dotted key. Specs read the run config only
through it, so algos/ never sees a config object."""
Check = Callable[[Setting], list]
"""A spec's check of the run config: one line per problem (naming the key and the fix), [] when fine."""


def _no_problems(setting: Setting) -> list[str]:
    return []


@dataclass(frozen=True)
class AdvantageSpec:
    """What an advantage estimator needs besides rewards, mask and group index, and what it checks."""

    needs_values: bool = False
    """Critic values ``[B, T]``: the critic is built and trained (``critic.enable`` null means this)."""
    needs_greedy_baseline: bool = False
    """``reward_baselines [B]``: the reward of one greedy response per prompt, generated every step."""
    needs_implicit_prm: bool = False
    """``prm_rewards [B, T]``: PRIME's implicit process reward model is built, trained on the outcome labels every
    step, and its dense rewards ``beta * log(pi_phi / pi_ref)`` computed."""
    needs_reference: bool = False
    """``ref_log_probs [B, T]``: the reference policy runs every step even without a KL term."""
    knobs: Mapping[str, str] = field(default_factory=dict)
    """Keyword argument -> the run-config key it is read from
    (``{"reward_weights": "algorithm.gdpo_reward_weights"}``)."""
    inputs: Mapping[str, Callable[[Any, Setting], Any]] = field(default_factory=dict)
    """Keyword argument -> ``build(batch, setting)``: an input derived from the batch's columns (``batch[key]``,
    ``key in batch``) and the run config, e.g. GDPO's per-component scores ``{name: [B]}``."""
    check: Check = _no_problems
    """Problems of the run config for this estimator, found before any model loads."""

    def arguments(self, batch: Any, setting: Setting) -> dict[str, Any]:
        """The estimator-specific keyword arguments: its knobs' values and its derived inputs."""
        return {**{name: setting(key) for name, key in self.knobs.items()},
                **{name: build(batch, setting) for name, build in self.inputs.items()}}


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss's own knobs (a small frozen dataclass) and where the run config keeps them."""

    config: type
    """The loss's knobs, e.g. ``ClipCovConfig(clip_ratio, clip_ratio_low, clip_ratio_high, clip_cov_ratio, ...)``."""
    knobs: Mapping[str, str] = field(default_factory=dict)
    """Knob -> run-config key, for the knobs the actor does not pass to every loss (the clip ratios it does)."""
    check: Check = _no_problems
    """Problems of the run config for this loss, found before any model loads."""
    whole_groups: bool = False
    """The loss reads whole prompt groups (GVPO's group means, from the rows' ``index``): the rows of one prompt
    stay in one data shard when the batch is balanced (``trainer.balance_batch``) and in one micro-batch."""

    def knob_values(self, setting: Setting) -> dict[str, Any]:
        return {name: setting(key) for name, key in self.knobs.items()}


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
_ADVANTAGE_SPECS: dict[str, AdvantageSpec] = {}
_POLICY_LOSS_SPECS: dict[str, PolicyLossSpec] = {}


def register_advantage(name: str, **spec) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``algorithm.adv_estimator=name``, with what it needs
    (``AdvantageSpec``'s fields: ``needs_values=True``, ``knobs={...}``, ``inputs={...}``, ``check=fn``)."""
    register = ADVANTAGES.register(name)
    built = AdvantageSpec(**spec)

    def decorator(fn: Callable) -> Callable:
        fn = register(fn)  # raises before the spec changes when the name is taken by another function
        _ADVANTAGE_SPECS[name] = built
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


def register_policy_loss(name: str, *, config: type | None = None, knobs: Mapping[str, str] | None = None,
                         check: Check = _no_problems, whole_groups: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn(inputs, config, agg) -> (loss, metrics)`` available as ``actor.policy_loss.loss_mode=name``;
    ``config`` is the dataclass of its knobs (none: ``NoKnobs``). The registered (and returned) function takes the
    flat keyword call of the module docstring (``policy_losses/common.py: keyword_policy_loss``)."""
    # imported here: the loss modules import this one while the policy_losses package initialises
    from hybridflow.algos.policy_losses.common import NoKnobs, keyword_policy_loss

    register = POLICY_LOSSES.register(name)
    built = PolicyLossSpec(config=config or NoKnobs, knobs=dict(knobs or {}), check=check, whole_groups=whole_groups)

    def decorator(fn: Callable) -> Callable:
        loss = register(keyword_policy_loss(fn, built.config))
        _POLICY_LOSS_SPECS[name] = built
        return loss

    return decorator


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """The knobs and checks of the policy loss registered as ``name`` (an unknown name raises)."""
    POLICY_LOSSES.get(name)
    return _POLICY_LOSS_SPECS[name]


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as ``name``."""
    return POLICY_LOSSES.get(name)


def list_policy_losses() -> list[str]:
    return POLICY_LOSSES.names()


def list_kl_controllers() -> list[str]:
    """``algorithm.kl_ctrl.type`` values (:data:`hybridflow.algos.kl_controllers.KL_CONTROLLERS`)."""
    from hybridflow.algos.kl_controllers import KL_CONTROLLERS

    return list(KL_CONTROLLERS)

