"""verl keys hybridflow accepts only for compatibility: the one table of them.

Each entry maps a dotted key to a one-line reason (what the key selects in verl and why
it changes nothing here). Such a key may appear in a verl script or YAML without an
error; setting it to a non-default value warns once. Every other key of the schemas is
read by some code.
"""

COMPAT_ONLY: dict[str, str] = {
    "trainer.use_legacy_worker_impl": (
        "selects between verl's legacy and new worker classes; hybridflow has one worker implementation"),
    "actor_rollout_ref.model.use_shm": (
        "makes verl copy the model to /dev/shm before loading; hybridflow loads from model.path"),
    **{f"reward_model.rollout.{name}": (
        "sizes the inference server verl's reward loop runs a judge on; hybridflow's generative judge runs "
        "on an in-process engine sized by reward_model.rollout.{name,prompt_length,response_length}")
       for name in ("dtype", "gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes",
                    "free_cache_engine", "data_parallel_size", "expert_parallel_size",
                    "tensor_model_parallel_size", "max_num_batched_tokens", "max_model_len", "max_num_seqs",
                    "load_format", "limit_images", "enable_chunked_prefill",
                    "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init")},
}
"""Dotted config key -> why it is accepted without effect."""
