"""verl 0.9.1's image pre-resize by ``data.image_patch_size`` (qwen_vl_utils' ``fetch_image``, which its RL dataset
calls before the processor when it counts an image prompt for ``filter_overlong_prompts``).

An image of ``H x W`` becomes ``H' x W'``, both multiples of ``f = 2 * image_patch_size`` (2: the merge of 2 x 2
patches into one token), the aspect ratio kept as well as the grid allows, the area within
``[4 f^2, 16384 f^2]`` (4 to 16384 tokens)::

    H' = max(f, round(H / f) f),  W' likewise                      (nearest multiples)
    if H' W' > max:  b = sqrt(H W / max);  H' = floor(H / b / f) f,  W' likewise
    if H' W' < min:  b = sqrt(min / (H W));  H' = ceil(H b / f) f,   W' likewise

(``round`` is Python's, half to even, as qwen_vl_utils'). The processor then resizes again with its own patch size
and pixel bounds: with ``image_patch_size`` equal to the processor's patch size and the Qwen-VL default bounds the
two agree and the pre-resize changes nothing.
"""

from __future__ import annotations

import math

MERGE = 2
MIN_TOKENS, MAX_TOKENS = 4, 16384
MAX_ASPECT_RATIO = 200


def patch_grid_size(height: int, width: int, *, factor: int) -> tuple[int, int]:
    """``(H', W')`` of the module docstring; ValueError for an aspect ratio above 200 (the processor's limit too)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} is above {MAX_ASPECT_RATIO}")
    low, high = MIN_TOKENS * factor ** 2, MAX_TOKENS * factor ** 2
    new_h, new_w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if new_h * new_w > high:
        beta = math.sqrt(height * width / high)
        new_h, new_w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif new_h * new_w < low:
        beta = math.sqrt(low / (height * width))
        new_h, new_w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return new_h, new_w


def resize_to_patches(image, *, image_patch_size: int):
    """The RGB PIL ``image`` resized to :func:`patch_grid_size` with factor ``2 * image_patch_size`` (PIL's default
    filter, as qwen_vl_utils)."""
    height, width = patch_grid_size(image.height, image.width, factor=MERGE * image_patch_size)
    return image.resize((width, height))
