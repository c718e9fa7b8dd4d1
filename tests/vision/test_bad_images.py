"""Image rows PIL or the processor cannot use: each is one DataError line naming the row, the image and the fix,
raised while the dataset is built (before any model step)."""

from __future__ import annotations

import struct
import zlib

import pandas as pd
import pytest

from hybridflow.data.rl_dataset import RLDataset
from hybridflow.data.vision import image_to_bytes
from hybridflow.errors import DataError
from tests.vision.conftest import solid_image


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width x height`` RGB pixels and whose body holds none: what a decompression
    bomb looks like to ``Image.open`` (it checks the declared size against ``Image.MAX_IMAGE_PIXELS``)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def dataset_with_image(tmp_path, processor, image) -> RLDataset:
    """An RL dataset of a good image row, then a row holding ``image``."""
    rows = [{"prompt": [{"role": "user", "content": f"<image>Row {i}?"}], "images": [entry]}
            for i, entry in enumerate([image_to_bytes(solid_image(28, 28)), image])]
    path = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return RLDataset(str(path), processor.tokenizer, processor=processor, max_prompt_length=256)


def text_file(tmp_path) -> str:
    path = tmp_path / "notes.png"
    path.write_text("not an image\n")
    return str(path)


good_png = image_to_bytes(solid_image(28, 28))["bytes"]
BAD_IMAGES = {
    "decompression bomb": (lambda tmp: {"bytes": png_declaring(100_000, 100_000)},
                           r"row 1: image 0 \(\d+ bytes\) is too large to decode safely .*10000000000 pixels.*; "
                           "downscale it, or drop the row"),
    "corrupt bytes": (lambda tmp: {"bytes": b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 4},
                      r"row 1: image 0 \(\d+ bytes\) is not a readable image .*re-encode it as PNG or JPEG"),
    "truncated bytes": (lambda tmp: {"bytes": good_png[: len(good_png) // 2]},
                        r"row 1: image 0 \(\d+ bytes\) is not a readable image \(image file is truncated\)"),
    "text file as image path": (lambda tmp: {"path": text_file(tmp)},
                                r"row 1: image 0 \(file '.*notes.png'\) is not a readable image \(cannot identify"),
    "1 x 10000 image": (lambda tmp: image_to_bytes(solid_image(1, 10_000)),
                        r"row 1: the image processor refused the row's image\(s\) \(1x10000\): absolute aspect ratio "
                        r"must be smaller than 200.*; resize or pad"),
}


@pytest.mark.parametrize("case", BAD_IMAGES)
def test_an_unusable_image_is_one_line_naming_the_row(tmp_path, vl_arch, case):
    _, processor = vl_arch
    make, message = BAD_IMAGES[case]
    with pytest.raises(DataError, match=message) as err:
        dataset_with_image(tmp_path, processor, make(tmp_path))
    assert "\n" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__  # the one line is all the user sees
