"""verl's module name for SFT: ``torchrun ... -m hybridflow.trainer.fsdp_sft_trainer key=value ...``.

The same trainer as :mod:`hybridflow.trainer.sft_trainer` (FSDP2 when more than one rank),
so verl's ``examples/sft`` scripts run with only the module prefix changed.
"""

import sys

from hybridflow.trainer.sft_trainer import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m hybridflow.trainer.fsdp_sft_trainer"))
