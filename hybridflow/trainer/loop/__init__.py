"""The training loop and its parts: one ``fit()`` (``fit.py``) composed of a rollout source, a weight sync and an
update, each owning its share of the checkpoint (see ``parts.py``). An entry point is a choice of parts."""
