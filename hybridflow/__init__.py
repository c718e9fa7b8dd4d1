"""hybridflow: RL post-training for LLMs with verl's config surface, from a CPU laptop to a Ray cluster."""

import os as _os

from hybridflow import omp as _omp

# OpenMP workers spin ~1 ms between parallel regions where the cores are idle at start-up and sleep at
# once where other processes hold them (hybridflow/omp.py says why). libgomp reads the choice once,
# when torch loads it, hence here, at package import, before anything imports torch.
_omp.apply()
# torch's CPU allocator: buffers of 2 MiB or more on transparent huge pages (madvise), so that a
# step's fresh activations fault in 2 MiB at a time instead of 4 KiB: on a VM each fault is
# microseconds, and an update's first steps fault in gigabytes (docs/benchmarks.md). Read at
# torch's first allocation; THP_MEM_ALLOC_ENABLE=0 turns it off.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
