"""The math of RL post-training: pure tensor functions, explicit keyword arguments.

Importing this package registers every advantage estimator and policy loss, so
``get_advantage("grpo")`` / ``get_policy_loss("vanilla")`` work after
``import hybridflow.algos``. See docs/algorithms.md for the table of names, equations
and papers.
"""

from hybridflow.algos import advantages as _advantages  # noqa: F401  (registers estimators)
from hybridflow.algos import policy_losses as _policy_losses  # noqa: F401  (registers losses)
from hybridflow.algos.agg import agg_loss, list_loss_agg_modes, seq_norm_length
from hybridflow.algos.errors import AlgorithmError, UnknownAlgorithmError
from hybridflow.algos.kl import kl_penalty, list_kl_penalties
from hybridflow.algos.kl_controllers import AdaptiveKLController, FixedKLController, build_kl_controller
from hybridflow.algos.kl_reward import apply_kl_penalty
from hybridflow.algos.logprob import entropy_from_logits, logprob_and_entropy, logprobs_from_logits
from hybridflow.algos.overlong import overlong_penalty
from hybridflow.algos.preference import dpo_loss, ipo_loss, sppo_loss
from hybridflow.algos.registry import (
    advantage_spec,
    get_advantage,
    get_policy_loss,
    list_advantages,
    list_policy_losses,
    policy_loss_spec,
    register_advantage,
    register_policy_loss,
)
from hybridflow.algos.stats import masked_mean, masked_sum, masked_var, masked_whiten
from hybridflow.algos.value_loss import value_loss

__all__ = [
    "AdaptiveKLController",
    "AlgorithmError",
    "FixedKLController",
    "build_kl_controller",
    "UnknownAlgorithmError",
    "agg_loss",
    "apply_kl_penalty",
    "dpo_loss",
    "entropy_from_logits",
    "advantage_spec",
    "get_advantage",
    "get_policy_loss",
    "ipo_loss",
    "kl_penalty",
    "list_advantages",
    "list_kl_penalties",
    "list_loss_agg_modes",
    "seq_norm_length",
    "list_policy_losses",
    "logprob_and_entropy",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss_spec",
    "register_advantage",
    "register_policy_loss",
    "sppo_loss",
    "value_loss",
]
