"""Policy losses; importing this package registers all of them."""

from hybridflow.algos.policy_losses import (  # noqa: F401  (imported to register)
    cispo,
    clip_cov,
    gpg,
    gspo,
    kl_cov,
    vanilla,
)
