"""The trainers, by concern:

- the entry points, here: ``main_ppo`` (PPO, GRPO, DAPO's refill, ...), ``main_dapo``, ``main_prime``,
  ``main_fully_async``, ``main_one_step_off``, ``main_spin``, ``main_sppo``, ``sft_trainer`` (and verl's
  ``fsdp_sft_trainer`` name), ``demo``; each checks its config before any model loads and chooses the loop's parts;
- ``loop/``: the one RL training loop (``fit.py``) and its parts: rollout sources, weight syncs, updates;
- ``roles/``: role assembly: which workers a run has, how they are built and placed;
- ``checkpoints/``: step directories, atomic publication, resume, the best checkpoint;
- ``tracking/``: metrics, trackers, generations, the summary table and plots;
- ``sft/``: the SFT trainer's parts.
"""
