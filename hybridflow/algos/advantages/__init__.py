"""Advantage estimators; importing this package registers all of them."""

from hybridflow.algos.advantages import (  # noqa: F401  (imported to register)
    gae,
    gpg,
    grpo,
    grpo_passk,
    opo,
    reinforce_pp,
    remax,
    rloo,
)
