"""``python -m hybridflow.model_merger merge`` on a critic checkpoint exports the value model."""

import torch

from hybridflow.model_merger import main as merger_main
from hybridflow.models import load_tokenizer
from hybridflow.models.sharded_checkpoint import FSDPModelComponent
from hybridflow.models.value_model import load_value_model


def test_critic_checkpoint_merges_into_a_value_model_folder(tmp_path, tiny_model_dir):
    critic = load_value_model(tiny_model_dir)
    torch.manual_seed(0)
    torch.nn.init.normal_(critic.value_head.weight)  # a trained head, not the zero init a fresh model gets
    torch.nn.init.normal_(critic.value_head.bias)
    optimizer = torch.optim.AdamW(critic.parameters())
    critic_dir = tmp_path / "global_step_1" / "critic"
    critic_dir.mkdir(parents=True)
    FSDPModelComponent(critic, optimizer, tokenizer=load_tokenizer(tiny_model_dir)).save_to(str(critic_dir))

    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(critic_dir),
                        "--target_dir", str(tmp_path / "value")]) == 0
    exported = load_value_model(str(tmp_path / "value"))
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        expected, got = critic(ids), exported(ids)
    assert expected.abs().sum() > 0  # the head really is non-trivial
    torch.testing.assert_close(got, expected)
    assert load_tokenizer(str(tmp_path / "value")).vocab_size == load_tokenizer(tiny_model_dir).vocab_size
