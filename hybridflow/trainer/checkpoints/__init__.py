"""Checkpointing: the step directories and their atomic publication (``manager.py``), the components that
write themselves into them, the integrity manifest, and the best-checkpoint record."""
