"""Policy losses; importing this package registers all of them."""

from hybridflow.algos.policy_losses import (  # noqa: F401  (imported to register)
    bypass,
    cispo,
    clip_cov,
    dppo,
    dro,
    geo_mean,
    gpg,
    gspo,
    kl_cov,
    sapo,
    vanilla,
)
