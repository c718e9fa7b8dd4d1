"""Distillation teachers (issue 60): each row scored by the teacher its teacher_key routes it to, top-k on demand,
and the student's top-k gather the same in the padded and packed layouts."""

import pytest
import torch

from hybridflow.errors import HybridflowError
from hybridflow.models import load_causal_lm
from hybridflow.models.tiny import save_tiny_model
from hybridflow.workers.logprob import batch_log_probs, micro_batch_log_probs
from hybridflow.workers.teacher import TeacherWorker
from tests.controller.test_ray_group import rollout_batch


@pytest.fixture(scope="module")
def two_teachers(tmp_path_factory):
    models = []
    for seed in (1, 2):
        path = tmp_path_factory.mktemp(f"teacher{seed}")
        save_tiny_model(str(path), arch="llama", seed=seed)
        models.append(load_causal_lm(str(path)).eval())
    return models


def routed_batch():
    batch = rollout_batch()
    batch["data_source"] = ["gsm8k", "math", "math", "gsm8k", "gsm8k", "math", "math", "gsm8k"]
    return batch


def test_rows_go_to_the_teacher_their_key_names(two_teachers):
    first, second = two_teachers
    batch = routed_batch()
    worker = TeacherWorker(teachers={"gsm8k": first, "math": second}, route_by="data_source", micro_batch_size=3)
    (scores,) = worker.compute_teacher_log_prob(batch)
    own = [batch_log_probs(model, batch, temperature=1.0, micro_batch_size=None)[0] for model in (first, second)]
    mask = batch["response_mask"].bool()
    for row, source in enumerate(batch["data_source"]):
        expected = own[0 if source == "gsm8k" else 1][row]
        assert torch.allclose(scores[row][mask[row]], expected[mask[row]], atol=1e-5), row
    assert not torch.allclose(own[0], own[1], atol=1e-3)  # the two teachers differ, so routing is visible


def test_a_single_teacher_scores_every_row_at_temperature_one(two_teachers):
    batch = routed_batch()
    (scores,) = TeacherWorker(teachers={"default": two_teachers[0]}).compute_teacher_log_prob(batch)
    expected, _ = batch_log_probs(two_teachers[0], batch, temperature=1.0, micro_batch_size=None)
    mask = batch["response_mask"].bool()
    assert torch.allclose(scores[mask], expected[mask], atol=1e-6)


def test_an_unrouted_row_is_named():
    batch = routed_batch()
    worker = TeacherWorker(teachers={"gsm8k": torch.nn.Linear(1, 1)}, route_by="data_source")
    with pytest.raises(HybridflowError, match="row 1 has 'math'"):
        worker.compute_teacher_log_prob(batch)


def test_topk_is_the_teacher_s_k_most_likely_next_tokens(two_teachers):
    model, batch = two_teachers[0], routed_batch()
    values, ids = TeacherWorker(teachers={"default": model}, topk=3, micro_batch_size=5).compute_teacher_log_prob(batch)
    assert values.shape == ids.shape == (*batch["responses"].shape, 3)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits
    width = batch["responses"].shape[1]
    full = torch.log_softmax(logits[:, -width - 1:-1].float(), dim=-1)
    mask = batch["response_mask"].bool()
    expected_values, expected_ids = full.topk(3, dim=-1)
    assert torch.allclose(values[mask], expected_values[mask], atol=1e-5)
    assert torch.equal(ids[mask], expected_ids[mask])
    assert (values[~mask] == 0).all()


@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prompt"])
def test_student_gather_of_teacher_ids_matches_the_full_softmax(two_teachers, layout):
    model, batch = two_teachers[1], routed_batch()
    ids = torch.randint(0, model.config.vocab_size, (*batch["responses"].shape, 4), generator=torch.Generator()
                        .manual_seed(0))
    log_prob, _, gathered = micro_batch_log_probs(model, batch, temperature=0.7, calculate_entropy=False,
                                                  layout=layout, gather_ids=ids)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits
    width = batch["responses"].shape[1]
    full = torch.log_softmax(logits[:, -width - 1:-1].float() / 0.7, dim=-1)
    mask = batch["response_mask"].bool()
    assert torch.allclose(gathered[mask], full.gather(-1, ids)[mask], atol=1e-4)
    assert torch.allclose(log_prob[mask], full.gather(-1, batch["responses"][..., None])[..., 0][mask], atol=1e-4)
