"""Config errors a model can carry that transformers lets through, refused at load in one line (issue 58): each
would otherwise be a traceback deep in the first forward (SDPA's shapes, ``torch.topk``'s k, a view that does not
divide), or in the rollout's HF ``generate``."""

from __future__ import annotations

from hybridflow.errors import ModelError


def check_model_shapes(config, path: str) -> None:
    """Attention heads, multi-head latent attention (MLA) ranks and group-limited routing of ``config``'s text
    model; one ModelError line naming the field and the fix."""
    text = config.get_text_config()
    where = f"{path}/config.json (or model.override_config)"
    if getattr(text, "kv_lora_rank", None) is not None:
        _check_latent_attention(text, where)
    else:
        _check_heads(text, where)
    _check_routing_groups(text, where)


def _check_heads(text, where: str) -> None:
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        return
    if kv_heads < 1 or heads % kv_heads:
        raise ModelError(f"{where} has num_attention_heads={heads} and num_key_value_heads={kv_heads}: each key/value "
                         f"head serves a whole group of query heads, so num_key_value_heads must divide "
                         f"num_attention_heads (1, or a divisor of {heads})")


def _check_latent_attention(text, where: str) -> None:
    """DeepSeek-V2/V3 (and Kimi-K2) attention: keys and values are expanded from a latent of ``kv_lora_rank``
    to one per query head, so there is no grouping of heads to configure."""
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None)
    if kv_heads is not None and kv_heads != heads:
        raise ModelError(f"{where} has num_key_value_heads={kv_heads} but num_attention_heads={heads}: multi-head "
                         "latent attention (kv_lora_rank) expands its latent into one key and value per query head, "
                         f"so set num_key_value_heads={heads} (DeepSeek-V3's own config does)")
    ranks = {"kv_lora_rank": text.kv_lora_rank, "q_lora_rank": getattr(text, "q_lora_rank", None),
             "qk_rope_head_dim": getattr(text, "qk_rope_head_dim", None),
             "v_head_dim": getattr(text, "v_head_dim", None)}
    for name, value in ranks.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ModelError(f"{where} has {name}={value!r}: multi-head latent attention needs a positive size "
                             f"(q_lora_rank may be null: no query compression)")
    nope = getattr(text, "qk_nope_head_dim", 0)
    if not isinstance(nope, int) or nope < 0:
        raise ModelError(f"{where} has qk_nope_head_dim={nope!r}: the query/key width without rotary must be >= 0")
    rope = ranks["qk_rope_head_dim"]
    if rope is not None and rope % 2:
        raise ModelError(f"{where} has qk_rope_head_dim={rope}: the rotary part rotates pairs of dimensions, so it "
                         "must be even")


def _check_routing_groups(text, where: str) -> None:
    """DeepSeek-V3 / GLM-4.5 routing: experts in ``n_group`` groups, a group scored by its best two experts, the
    top ``topk_group`` groups kept, then ``num_experts_per_tok`` experts among theirs."""
    groups, kept = getattr(text, "n_group", None), getattr(text, "topk_group", None)
    experts, top_k = getattr(text, "n_routed_experts", None), getattr(text, "num_experts_per_tok", None)
    if groups is None or not experts:
        return
    if not isinstance(groups, int) or groups < 1 or experts % groups:
        raise ModelError(f"{where} has n_group={groups} for its n_routed_experts={experts}: the experts are split "
                         f"into n_group equal groups, so n_group must divide {experts}")
    per_group = experts // groups
    if groups > 1 and per_group < 2:
        raise ModelError(f"{where} has n_group={groups} groups of {per_group} expert for n_routed_experts={experts}: "
                         "a group is scored by its best two experts, so n_group must be at most "
                         f"{experts // 2} (or 1: no groups)")
    if kept is None or not 1 <= kept <= groups:
        raise ModelError(f"{where} has topk_group={kept} of n_group={groups}: the routing keeps topk_group of the "
                         f"groups, so set topk_group between 1 and {groups}")
    if top_k is not None and top_k > kept * per_group:
        raise ModelError(f"{where} routes each token to num_experts_per_tok={top_k} experts among topk_group={kept} "
                         f"group(s) of {per_group}: at most {kept * per_group} experts are kept; raise topk_group or "
                         "lower num_experts_per_tok")
