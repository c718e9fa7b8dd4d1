"""hybridflow: RL post-training for LLMs with verl's config surface, from a CPU laptop to a Ray cluster."""

__version__ = "0.1.0"
