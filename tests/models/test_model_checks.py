"""The model checks: a config or weights that do not make the model they claim give one ModelError line.

Each case is a tiny llama folder with its config.json edited the way a user's copy goes wrong.
"""

import json
import logging
import shutil

import pytest

from hybridflow.errors import ModelError
from hybridflow.models import load_causal_lm
from hybridflow.models.reward_model import load_reward_model
from hybridflow.models.value_model import load_value_model


def edited_copy(tiny_model_dir, tmp_path, **config_changes) -> str:
    """A copy of the tiny llama folder whose config.json has ``config_changes`` applied."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_unknown_model_type_names_it_and_the_ways_out(tiny_model_dir, tmp_path):
    path = edited_copy(tiny_model_dir, tmp_path, model_type="foo", architectures=["FooForCausalLM"])
    with pytest.raises(ModelError, match=r"model_type 'foo', which transformers .* does not know.*trust_remote_code"):
        load_causal_lm(path)


def test_architecture_without_a_causal_lm_class_is_refused(tiny_model_dir, tmp_path):
    path = edited_copy(tiny_model_dir, tmp_path, model_type="t5", architectures=["T5ForConditionalGeneration"])
    with pytest.raises(ModelError, match=r"'t5' model \(T5ForConditionalGeneration\).* cannot load as a causal LM"):
        load_causal_lm(path)


def test_hidden_size_disagreeing_with_the_weights_names_both_shapes(tiny_model_dir, tmp_path):
    path = edited_copy(tiny_model_dir, tmp_path, hidden_size=128)
    with pytest.raises(ModelError, match=r"do not fit its config.json: .* is \[512, 64\] in the weights but "
                                         r"\[512, 128\] by config.json .*hidden_size=128"):
        load_causal_lm(path)


def test_bert_config_over_llama_weights_is_refused_not_trained_at_random(tiny_model_dir, tmp_path):
    path = edited_copy(tiny_model_dir, tmp_path, model_type="bert", architectures=["BertForMaskedLM"])
    with pytest.raises(ModelError, match=r"^(\d+) of \1 weights of the 'bert' model .* are not in its weights files "
                                         r"\(20 weights there are unexpected\).*restore the original config.json"):
        load_causal_lm(path)
    with pytest.raises(ModelError, match="weights of the 'bert' model"):  # the critic's backbone too
        load_value_model(path)


def test_one_weight_missing_from_the_files_is_refused_too(tiny_model_dir, tmp_path):
    """No tolerance for a causal LM's own weights: one left at random is refused."""
    from safetensors.torch import load_file, save_file

    path = edited_copy(tiny_model_dir, tmp_path)
    weights = load_file(f"{path}/model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, f"{path}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"^1 of 21 weights of the 'llama' model .* \(0 weights there are unexpected\)"):
        load_causal_lm(path)


def test_a_fresh_reward_head_over_a_causal_lm_is_allowed(tiny_model_dir):
    """The tolerance: a reward model's ``score`` head is new on a causal LM checkpoint, on purpose."""
    assert load_reward_model(tiny_model_dir).score.weight.shape[0] == 1


def test_resuming_a_checkpoint_of_another_size_names_the_tensor_and_the_way_out(tmp_path):
    from hybridflow.errors import CheckpointError
    from hybridflow.models.sharded_checkpoint import load_sharded, save_sharded
    from hybridflow.models.tiny import build_tiny_model

    small, tokenizer = build_tiny_model()
    save_sharded(str(tmp_path / "dcp"), model=small)
    larger, _ = build_tiny_model(tokenizer=tokenizer, hidden_size=128)
    with pytest.raises(CheckpointError, match=r"holds a model of another size: model.embed_tokens.weight is \[512, 64\] "
                                              r"there but \[512, 128\] .*trainer.start_over=true"):
        load_sharded(str(tmp_path / "dcp"), model=larger)
    deeper, _ = build_tiny_model(tokenizer=tokenizer, num_hidden_layers=3)
    with pytest.raises(CheckpointError, match=r"holds another model: 9 of 30 weights .* are not in it \(first: "
                                              r"model.layers.2.self_attn.q_proj.weight\)"):
        load_sharded(str(tmp_path / "dcp"), model=deeper)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def load_report():
    """Messages transformers' loader logs (its LOAD REPORT table among them)."""
    logger, handler = logging.getLogger("transformers.modeling_utils"), _Collect()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_a_refused_model_gets_its_one_line_without_the_load_report_table(tiny_model_dir, tmp_path, load_report):
    path = edited_copy(tiny_model_dir, tmp_path, model_type="bert", architectures=["BertForMaskedLM"])
    with pytest.raises(ModelError):
        load_causal_lm(path)
    assert not any("LOAD REPORT" in message for message in load_report)
    load_reward_model(tiny_model_dir)  # a model that loads still shows the report (its fresh score head)
    assert any("LOAD REPORT" in message and "score.weight" in message for message in load_report)


def test_an_architecture_registered_by_external_lib_passes_the_checks(tiny_model_dir, tmp_path):
    """What ``model.external_lib`` does: register a config and causal-LM class with the Auto classes."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    class RegisteredConfig(LlamaConfig):
        model_type = "registered_llama_for_model_checks"

    class RegisteredForCausalLM(LlamaForCausalLM):
        config_class = RegisteredConfig

    AutoConfig.register(RegisteredConfig.model_type, RegisteredConfig, exist_ok=True)
    AutoModelForCausalLM.register(RegisteredConfig, RegisteredForCausalLM, exist_ok=True)
    path = edited_copy(tiny_model_dir, tmp_path, model_type=RegisteredConfig.model_type,
                       architectures=["RegisteredForCausalLM"])
    assert isinstance(load_causal_lm(path), RegisteredForCausalLM)


def test_a_known_model_type_with_a_field_transformers_rejects_quotes_it(tiny_model_dir, tmp_path):
    """Not every ValueError from the config is an unknown architecture: the message says which."""
    path = edited_copy(tiny_model_dir, tmp_path, num_attention_heads=5)
    with pytest.raises(ModelError, match=r"transformers cannot read .*config.json \(model_type 'llama'\): .*; fix that "
                                         r"field of config.json"):
        load_causal_lm(path)


@pytest.fixture(scope="module")
def tiny_moe_dirs(tmp_path_factory):
    from hybridflow.models.tiny import save_tiny_model

    return {arch: save_tiny_model(str(tmp_path_factory.mktemp(arch)), arch=arch) for arch in ("qwen3_moe", "mixtral")}


@pytest.mark.parametrize("arch, change, message", [
    ("qwen3_moe", {"num_experts_per_tok": 8}, "routes each token to num_experts_per_tok=8 of its 4 experts: set "
                                              "num_experts_per_tok between 1 and 4"),
    ("mixtral", {"num_experts_per_tok": 5}, "routes each token to num_experts_per_tok=5 of its 4 experts"),
    ("qwen3_moe", {"num_experts_per_tok": 0}, "routes each token to num_experts_per_tok=0 of its 4 experts"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "has decoder_sparse_step=0: every how many layers a layer is a mixture "
                                              "of experts must be >= 1"),
])
def test_moe_routing_that_cannot_run_is_one_line_before_the_weights_load(tiny_moe_dirs, tmp_path, arch, change,
                                                                         message):
    """Issue 50: torch.topk's 'selected index k out of range' at the first forward, or a ZeroDivisionError while
    the layers were built."""
    path = edited_copy(tiny_moe_dirs[arch], tmp_path, **change)
    with pytest.raises(ModelError, match=f"^{path}/config.json \\(or model.override_config\\) {message}") as err:
        load_causal_lm(path)
    assert "\n" not in str(err.value)
    load_causal_lm(edited_copy(tiny_moe_dirs[arch], tmp_path / "ok", num_experts_per_tok=4))  # all experts: fine
