"""hybridflow: RL post-training for LLMs with verl's config surface, from a CPU laptop to a Ray cluster."""

import os as _os

# libgomp's default busy-waiting collapses throughput 10-25x when another process holds a
# core (measured in docs/benchmarks.md); passive waiting costs nothing on an idle machine.
# Only effective if set before torch initialises OpenMP, hence here, at package import.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
