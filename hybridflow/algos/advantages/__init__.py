"""Advantage estimators; importing this package registers all of them."""

from hybridflow.algos.advantages import (  # noqa: F401  (imported to register)
    aliases,
    gae,
    gdpo,
    gpg,
    grpo,
    grpo_passk,
    opo,
    optimal_token_baseline,
    prime,
    reinforce_pp,
    remax,
    rloo,
)
