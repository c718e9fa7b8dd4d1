"""Config errors a model can carry, refused at load in one line before any weight loads (issue 58): attention heads
that do not group, multi-head latent attention ranks, group-limited routing. Each was a traceback deep in the first
forward (SDPA's shapes in the rollout's HF generate, torch.topk's k, a view that does not divide)."""

import pytest

from hybridflow.errors import ModelError
from hybridflow.models import load_causal_lm
from tests.models.non_native import save_non_native
from tests.models.test_model_checks import edited_copy


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from hybridflow.models.tiny import save_tiny_model

    dirs = {arch: save_non_native(str(tmp_path_factory.mktemp(arch)), arch) for arch in ("deepseek_v3", "glm4_moe")}
    return {**dirs, "llama": save_tiny_model(str(tmp_path_factory.mktemp("llama")), arch="llama")}


@pytest.mark.parametrize("arch, change, message", [
    ("deepseek_v3", {"num_key_value_heads": 2}, "has num_key_value_heads=2 but num_attention_heads=4: multi-head "
                                                "latent attention .* so set num_key_value_heads=4"),
    ("deepseek_v3", {"kv_lora_rank": 0}, "has kv_lora_rank=0: multi-head latent attention needs a positive size"),
    ("deepseek_v3", {"qk_rope_head_dim": 7}, "has qk_rope_head_dim=7: the rotary part rotates pairs of dimensions"),
    ("deepseek_v3", {"n_group": 3}, "has n_group=3 for its n_routed_experts=4: .* n_group must divide 4"),
    ("deepseek_v3", {"n_group": 4}, "has n_group=4 groups of 1 expert .* at most 2 \\(or 1: no groups\\)"),
    ("deepseek_v3", {"topk_group": 3}, "has topk_group=3 of n_group=2: .* between 1 and 2"),
    ("deepseek_v3", {"num_experts_per_tok": 3}, "routes each token to num_experts_per_tok=3 experts among "
                                                "topk_group=1 group\\(s\\) of 2: at most 2 experts"),
    ("glm4_moe", {"topk_group": 2}, "has topk_group=2 of n_group=1"),
    ("llama", {"num_key_value_heads": 3}, "has num_attention_heads=4 and num_key_value_heads=3: .* must divide"),
])
def test_a_config_error_is_one_line_before_the_weights_load(model_dirs, tmp_path, arch, change, message):
    path = edited_copy(model_dirs[arch], tmp_path, **change)
    with pytest.raises(ModelError, match=f"^{path}/config.json \\(or model.override_config\\) {message}") as err:
        load_causal_lm(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["deepseek_v3", "glm4_moe"])
def test_the_models_as_built_pass(model_dirs, arch):
    load_causal_lm(model_dirs[arch])
