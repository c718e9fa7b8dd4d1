"""hybridflow: RL post-training for LLMs with verl's config surface, from a CPU laptop to a Ray cluster."""

import os as _os

# libgomp's default busy-waiting collapses throughput 10-25x when another process holds a
# core (measured in docs/benchmarks.md); passive waiting costs nothing on an idle machine.
# Only effective if set before torch initialises OpenMP, hence here, at package import.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch's CPU allocator: buffers of 2 MiB or more on transparent huge pages (madvise), so that a
# step's fresh activations fault in 2 MiB at a time instead of 4 KiB: on a VM each fault is
# microseconds, and an update's first steps fault in gigabytes (docs/benchmarks.md). Read at
# torch's first allocation; THP_MEM_ALLOC_ENABLE=0 turns it off.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
