"""A synthetic visual task, offline: how many shapes does a PIL-drawn image show? (``hybridflow/shape_count``)

    python -m hybridflow.data.preprocess.shape_count --size 256 --test_size 32 --local_save_dir DIR

Each image is ``--image_size`` pixels square on white, cut into a 3 x 3 grid; ``n`` (1..``--max_shapes``)
distinct cells each get one filled shape (circle, square or triangle, in one of four colours) that stays
inside its cell, so shapes never touch and the count is unambiguous. The row is verl's multimodal schema:
``images = [{"bytes": PNG}]``, the prompt ``"<image>How many shapes are in the image? ..."``, ground truth
``str(n)``, and ``messages`` (the prompt answered ``\\boxed{n}``) for SFT; ``hybridflow.rewards.shape_count``
verifies answers. Row ``i`` of a split is drawn from
``Random(seed + i)`` (test starts at ``seed + size``), so the files are the same on every machine.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

from hybridflow.data.preprocess.common import add_output_args, run_main, script_prog, write_splits
from hybridflow.data.vision import image_to_bytes
from hybridflow.errors import DataError

DATA_SOURCE = "hybridflow/shape_count"
QUESTION = "<image>How many shapes are in the image? Put the number in \\boxed{}."
GRID = 3
SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "blue", "green", "black")


def draw_shapes(shapes: Sequence[tuple[int, str, str]], *, image_size: int):
    """An RGB image with each ``(cell, kind, colour)`` drawn inside grid cell ``cell`` (row-major, 3 x 3)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (image_size, image_size), "white")
    draw = ImageDraw.Draw(image)
    cell_size = image_size // GRID
    margin = max(2, cell_size // 6)  # a gap on every side: shapes in neighbouring cells never touch
    for cell, kind, colour in shapes:
        x0, y0 = (cell % GRID) * cell_size + margin, (cell // GRID) * cell_size + margin
        x1, y1 = x0 + cell_size - 2 * margin, y0 + cell_size - 2 * margin
        if kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=colour)
    return image


def make_row(seed: int, *, split: str, index: int, max_shapes: int, image_size: int) -> dict[str, Any]:
    """One question: ``n`` shapes in distinct cells, drawn from ``Random(seed)``."""
    rng = random.Random(seed)
    count = rng.randint(1, max_shapes)
    shapes = [(cell, rng.choice(SHAPES), rng.choice(COLOURS)) for cell in rng.sample(range(GRID * GRID), count)]
    prompt = [{"role": "user", "content": QUESTION}]
    return {
        "data_source": DATA_SOURCE,
        "prompt": prompt,
        "messages": prompt + [{"role": "assistant", "content": f"\\boxed{{{count}}}"}],  # the SFT rows
        "images": [image_to_bytes(draw_shapes(shapes, image_size=image_size))],
        "ability": "visual_counting",
        "reward_model": {"style": "rule", "ground_truth": str(count)},
        "extra_info": {"split": split, "index": index, "shapes": [f"{colour} {kind}" for _, kind, colour in shapes]},
    }


def generate(*, size: int, seed: int, split: str, max_shapes: int = 5, image_size: int = 112) -> list[dict]:
    if not 1 <= max_shapes <= GRID * GRID:
        raise DataError(f"--max_shapes must be between 1 and {GRID * GRID} (one shape per grid cell), got {max_shapes}")
    return [make_row(seed + i, split=split, index=i, max_shapes=max_shapes, image_size=image_size)
            for i in range(size)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="train rows")
    parser.add_argument("--test_size", type=int, default=32, help="test rows")
    parser.add_argument("--seed", type=int, default=0, help="train seed; test uses seed + size")
    parser.add_argument("--max_shapes", type=int, default=5, help="most shapes in one image (at most 9)")
    parser.add_argument("--image_size", type=int, default=112, help="image width and height in pixels")
    add_output_args(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet``; returns split -> path."""
    args = parse_args(argv)
    shared = dict(max_shapes=args.max_shapes, image_size=args.image_size)
    splits = {"train": generate(size=args.size, seed=args.seed, split="train", **shared),
              "test": generate(size=args.test_size, seed=args.seed + args.size, split="test", **shared)}
    return write_splits(splits, args.local_save_dir)


if __name__ == "__main__":
    run_main(main)
