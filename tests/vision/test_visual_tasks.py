"""The geo3k scorer (hand-computed), the synthetic shape-count task's generator and verifier, geo3k's preprocess."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from hybridflow.data.preprocess import geo3k as geo3k_preprocess
from hybridflow.data.preprocess import shape_count
from hybridflow.rewards.geo3k import acc_reward, compute_score, format_reward
from hybridflow.rewards.registry import default_compute_score
from hybridflow.rewards.shape_count import extract_count
from tests.vision.conftest import solid_image

GOOD = "<think>the angles add to 180</think> so x is \\boxed{36}"


@pytest.mark.parametrize("response, fmt, acc, score", [
    (GOOD, 1.0, 1.0, 1.0),                                          # 0.9 * 1 + 0.1 * 1
    ("<think>hm</think> \\boxed{35}", 1.0, 0.0, 0.1),               # format only: 0.1 * 1
    ("x is \\boxed{36}", 0.0, 1.0, 0.9),                            # no <think>: 0.9 * 1
    ("x is 36", 0.0, 0.0, 0.0),                                     # no box: nothing to grade
    ("<think>a</think><think>b</think> \\boxed{72/2}", 1.0, 1.0, 1.0),  # math-verify: 72/2 = 36
    ("<think>\n</think>\\boxed{36.0}", 1.0, 1.0, 1.0),              # 36.0 = 36
])
def test_geo3k_score_is_format_plus_accuracy(response, fmt, acc, score):
    assert format_reward(response) == fmt
    assert acc_reward(response, "36") == acc
    assert compute_score(response, "36") == pytest.approx(score)
    assert compute_score(response, "36", format_score=0.5) == pytest.approx(0.5 * acc + 0.5 * fmt)
    routed = default_compute_score("hiyouga/geometry3k", response, "36")
    assert routed == {"score": pytest.approx(score), "acc": acc, "format": fmt}
    assert default_compute_score("geo3k", response, "36")["score"] == pytest.approx(score)


def test_geo3k_accuracy_without_the_box_and_with_latex():
    assert acc_reward("36", "36", use_boxed=False) == 1.0
    assert acc_reward("<think></think>\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert acc_reward("<think></think>\\boxed{2\\sqrt{3}}", "2\\sqrt{3}") == 1.0
    assert acc_reward("<think></think>\\boxed{2\\sqrt{2}}", "2\\sqrt{3}") == 0.0


@pytest.mark.parametrize("response, count", [
    ("\\boxed{3}", 3), ("there are 2 or maybe 4", 4), ("I see \\boxed{5 shapes} not 7", 5), ("none", None),
    ("\\boxed{x} 6", None),
    # a policy's ways around the verifier: several answers in the box, a number too long for int()
    ("\\boxed{2, 3}", None), ("\\boxed{1,2,3,4}", None), ("\\boxed{" + "3" * 5000 + "}", None), ("7" * 5000, None),
])
def test_shape_count_answer_extraction(response, count):
    assert extract_count(response) == count


def test_shape_count_verifier():
    assert default_compute_score("hybridflow/shape_count", "\\boxed{3}", "3") == 1.0
    assert default_compute_score("hybridflow/shape_count", "3 then \\boxed{4}", "3") == 0.0
    assert default_compute_score("hybridflow/shape_count", "", "3") == 0.0


def drawn_shapes(image) -> int:
    """Connected non-white regions of ``image`` (4-neighbourhood flood fill): the shapes a viewer counts."""
    width, height = image.size
    pixels = image.load()
    seen, count = set(), 0
    for start in ((x, y) for y in range(height) for x in range(width)):
        if start in seen or pixels[start] == (255, 255, 255):
            continue
        count += 1
        stack = [start]
        seen.add(start)
        while stack:
            x, y = stack.pop()
            for nxt in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if 0 <= nxt[0] < width and 0 <= nxt[1] < height and nxt not in seen and pixels[nxt] != (255, 255, 255):
                    seen.add(nxt)
                    stack.append(nxt)
    return count


def test_shape_count_images_show_as_many_shapes_as_the_ground_truth(tmp_path):
    from PIL import Image

    paths = shape_count.main(["--size", "12", "--test_size", "4", "--max_shapes", "9", "--local_save_dir",
                              str(tmp_path)])
    rows = pq.read_table(paths["train"]).to_pylist() + pq.read_table(paths["test"]).to_pylist()
    counts = []
    for row in rows:
        image = Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")
        assert image.size == (112, 112)
        counts.append(drawn_shapes(image))
        assert str(counts[-1]) == row["reward_model"]["ground_truth"]
        assert row["prompt"][0]["content"].startswith("<image>")
        assert default_compute_score(row["data_source"], row["messages"][-1]["content"],
                                     row["reward_model"]["ground_truth"]) == 1.0
    assert len(set(counts)) > 3  # the counts vary
    again = shape_count.main(["--size", "12", "--test_size", "4", "--max_shapes", "9", "--local_save_dir",
                              str(tmp_path / "again")])
    assert pq.read_table(again["train"]).to_pylist() == pq.read_table(paths["train"]).to_pylist()


def test_geo3k_preprocess_writes_verl_s_columns(tmp_path):
    import pandas as pd

    source = tmp_path / "geometry3k"
    source.mkdir()
    image = {"bytes": geo3k_preprocess_image(), "path": None}
    for split in ("train", "test"):
        pd.DataFrame([{"images": [image], "problem": "<image>Find x.", "answer": "36"}]).to_parquet(
            source / f"{split}-00000-of-00001.parquet")
    paths = geo3k_preprocess.main(["--local_dataset_path", str(source), "--local_save_dir", str(tmp_path / "out")])
    (row,) = pq.read_table(paths["test"]).to_pylist()
    assert sorted(row) == ["ability", "data_source", "extra_info", "images", "prompt", "reward_model"]
    assert row["data_source"] == "hiyouga/geometry3k" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": "<image>Find x. " + geo3k_preprocess.INSTRUCTION}]
    assert row["images"][0]["bytes"] == image["bytes"]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "36"}
    assert row["extra_info"] == {"split": "test", "index": 0, "answer": "36", "question": "<image>Find x."}


def geo3k_preprocess_image() -> bytes:
    buffer = io.BytesIO()
    solid_image(30, 20).save(buffer, format="PNG")
    return buffer.getvalue()
