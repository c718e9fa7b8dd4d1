"""``python -m hybridflow.trainer.main_sppo key=value ...``: SPPO (verl's ``recipe.sppo.main_sppo``).

Takes the keys of verl's ``recipe/sppo/run_qwen2.5-7b_rm.sh`` (``hybridflow config dump sppo`` lists all).
"""

from __future__ import annotations

import sys

from hybridflow.config.loader import run_from_config_args
from hybridflow.config.sppo import SPPOConfig
from hybridflow.errors import run_entry_point
from hybridflow.trainer.roles.self_play import run_self_play
from hybridflow.trainer.loop.sppo import SPPO, sppo_eta


def run_sppo(cfg: SPPOConfig):
    """Check, build, train; print the summary and write the plots."""
    sppo_eta(cfg)  # the two eta keys agree
    return run_self_play(cfg, schema=SPPOConfig, method=SPPO, trainer="SPPO")


USAGE_SUMMARY = "SPPO self-play with verl's recipe.sppo keys (also: hybridflow sppo)."


def run_from_args(args: list[str], *, prog: str = "python -m hybridflow.trainer.main_sppo") -> int:
    """``[--config-path D --config-name N] key=value ...`` -> a run (shared by ``hybridflow sppo``)."""
    return run_from_config_args(args, schema=SPPOConfig, run=run_sppo, trainer="sppo", prog=prog,
                                summary=USAGE_SUMMARY)


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(run_from_args, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
