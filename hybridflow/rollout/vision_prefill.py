"""Vision-language prompts in the native engine: a prompt's images, encoded once, and what each prefill chunk and
decode step needs of them (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

A Qwen-VL prompt holds one ``<|image_pad|>`` token per merged patch of each image. The engine serves such a prompt
with the same paged, continuously batched decoder as a text prompt; the images change three things:

- **embeddings**: when a generate call (or an agent turn) is submitted, the model's own vision tower
  (``get_image_features``) encodes every image of the call in one pass, and a prefill takes the tower's output in
  place of the embeddings of the image tokens it covers (HF's ``masked_scatter``). Qwen3-VL's tower also returns
  *deepstack* features, added to the residual stream at the image tokens after the first decoder layers. The
  ``n`` samples of a prompt share its prefill, images included (the engine prefills a prompt once).
- **positions**: the prompt's tokens get the model's 3-D M-RoPE positions (time, height, width; Wang et al. 2024,
  "Qwen2-VL", section 2.1), computed by the model's own ``get_rope_index``. Every token after the prompt is text,
  whose three coordinates are equal: ``index + delta`` with ``delta = max(prompt positions) + 1 - len(prompt)``
  (``<= 0`` for images: an image advances the position by ``max(h, w)`` merged patches but holds ``h * w`` tokens).
  M-RoPE with three equal coordinates is the 1-D rotary embedding at that position, for the sectioned layout of
  Qwen2-VL and the interleaved one of Qwen3-VL alike, so a decode step is the text decode step with each row
  rotated at ``position + delta`` (``rope_positions``) while it writes its cache slot at ``position``.
- **names**: a prompt's blocks are named (prefix cache) and deduplicated by its tokens; two prompts with the same
  text and different images must not share them, so in names each image token becomes a negative id derived from
  its image's pixels (:meth:`PromptImages.key_ids`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hybridflow.errors import RolloutError
from hybridflow.models.vision import check_image_tokens, image_token_id, is_vision_language, vision_tower


@dataclass(frozen=True)
class PrefillImages:
    """What one prefill chunk of ``L`` tokens takes from its prompt's images."""

    positions: torch.Tensor
    """``[3, L]`` long: the chunk's M-RoPE positions (time, height, width)."""
    rows: torch.Tensor
    """``[K]`` long: the chunk's image tokens, as row indices within the chunk."""
    embeds: torch.Tensor
    """``[K, hidden]``: the vision tower's output for those tokens, in the decoder's dtype and device."""
    deepstack: tuple[torch.Tensor, ...] = ()
    """Qwen3-VL: ``[K, hidden]`` per early decoder layer ``j``, added to the residual at ``rows`` after layer ``j``."""


@dataclass(frozen=True)
class PromptImages:
    """One prompt's images as the language model reads them (built by :func:`encode_prompt_images`)."""

    positions: torch.Tensor
    """``[3, P]`` long (CPU): the M-RoPE positions of the prompt's ``P`` tokens."""
    delta: int
    """Token ``i >= P`` (response, or a resumed sequence's tokens) sits at ``i + delta`` on all three axes."""
    rows: torch.Tensor
    """``[K]`` long (CPU): the prompt's image tokens, in order."""
    embeds: torch.Tensor
    """``[K, hidden]``: the tower's output for them (decoder dtype and device)."""
    deepstack: tuple[torch.Tensor, ...]
    """Qwen3-VL's deepstack features, ``[K, hidden]`` each; empty for Qwen2-VL / Qwen2.5-VL."""
    names: tuple[int, ...]
    """``[K]``: the negative id each image token takes in block names (one per image, from its pixels)."""

    def chunk(self, start: int, end: int) -> PrefillImages:
        """What the prefill of tokens ``start .. end - 1`` (of the prompt, or of a resumed sequence's prompt plus its
        tokens) takes."""
        length = self.positions.shape[1]
        inside = (self.rows >= start) & (self.rows < end)
        tail_start = max(start, length)  # a resumed sequence's tokens after the prompt: text at index + delta
        tail = torch.arange(tail_start, max(end, tail_start)) + self.delta
        positions = torch.cat([self.positions[:, start:min(end, length)], tail.expand(3, -1)], dim=1)
        device = self.embeds.device
        picked = inside.nonzero().flatten().to(device)
        return PrefillImages(positions=positions.to(device), rows=(self.rows[inside] - start).to(device),
                             embeds=self.embeds.index_select(0, picked),
                             deepstack=tuple(layer.index_select(0, picked) for layer in self.deepstack))

    def key_ids(self, token_ids: Sequence[int]) -> list[int]:
        """``token_ids`` with each image token replaced by its image's name: what names and deduplicates blocks."""
        keys = list(token_ids)
        for row, name in zip(self.rows.tolist(), self.names):
            keys[row] = name
        return keys


Encoded = tuple[torch.Tensor, tuple[torch.Tensor, ...]]
"""One image through the tower: ``(embeds [tokens, hidden], deepstack features [tokens, hidden] per layer)``."""


def encode_prompt_images(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                         multi_modal_inputs: Sequence[dict | None] | None, *,
                         encoded: dict[int, Encoded] | None = None) -> list[PromptImages | None]:
    """Each prompt's :class:`PromptImages` (``None`` for a prompt without images): the call's images the vision
    tower has not seen encoded in one pass, the positions from the model's ``get_rope_index``.

    ``encoded`` (image name -> its tower output), when given, is read and filled: an agent loop's later turns carry
    the conversation's earlier images again, and they are not encoded again (the engine empties it when its weights
    change).

    Raises:
        RolloutError: images for a text-only model.
        DataError: a prompt's image tokens that are not its images' ``sum t h w / merge^2``
            (:func:`~hybridflow.models.vision.check_image_tokens`); a prompt without images is checked where it is
            submitted (``RequestQueue.submit``), which every prompt goes through.
    """
    if multi_modal_inputs is None:
        multi_modal_inputs = [None] * len(prompts)
    if len(multi_modal_inputs) != len(prompts):
        raise RolloutError(f"generate() got {len(multi_modal_inputs)} multi_modal_inputs for {len(prompts)} prompts; "
                           "pass one dict (or None) per prompt")
    present = [i for i, row in enumerate(multi_modal_inputs) if row and row.get("pixel_values") is not None]
    if not is_vision_language(model.config):
        if present:
            raise RolloutError(f"{type(model).__name__} is a text-only model but prompts came with images; drop "
                               "data.image_key from the config or use a vision-language model")
        return [None] * len(prompts)
    for index in present:
        check_image_tokens(model, [multi_modal_inputs[index]], torch.tensor([list(prompts[index])]))
    per_prompt = {i: split_images(multi_modal_inputs[i]) for i in present}
    encoded = {} if encoded is None else encoded
    missing = {name: (pixels, grid) for images in per_prompt.values() for name, pixels, grid in images
               if name not in encoded}
    if missing:
        encoded.update(zip(missing, _tower_outputs(model, list(missing.values()))))
    return [_prompt_images(model, list(prompts[i]), per_prompt[i], encoded) if i in per_prompt else None
            for i in range(len(prompts))]


def split_images(row: dict) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """A row's images one by one: ``(name, patches [t h w, C * t' * p * p], grid [3])``, the name a negative id
    from a digest of the grid and the pixels (never a real token id)."""
    pixels = torch.as_tensor(row["pixel_values"])
    grids = torch.as_tensor(row["image_grid_thw"]).long().reshape(-1, 3)
    images, start = [], 0
    for grid in grids:
        count = int(grid.prod())
        patches = pixels[start : start + count]
        digest = hashlib.sha256(str(grid.tolist()).encode())  # SHA-NI: ~2x blake2b on a 448-px image
        digest.update(patches.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        images.append((-1 - (int.from_bytes(digest.digest()[:8], "little") >> 2), patches, grid))
        start += count
    return images


@torch.no_grad()
def _tower_outputs(model: torch.nn.Module, images: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Encoded]:
    """Per image ``(patches, grid)``, in order, its tower output, from one tower call over them all."""
    weight = next(vision_tower(model).parameters())
    pixels = torch.cat([patches for patches, _ in images]).to(device=weight.device, dtype=weight.dtype)
    grid = torch.stack([grid for _, grid in images]).to(weight.device)
    out = model.model.get_image_features(pixels, grid, return_dict=True)
    dtype = model.get_input_embeddings().weight.dtype
    layers = getattr(out, "deepstack_features", None) or []
    return [(e.to(dtype), tuple(layer[k].to(dtype) for layer in layers)) for k, e in enumerate(out.pooler_output)]


def _prompt_images(model: torch.nn.Module, prompt: list[int], images: list[tuple[int, torch.Tensor, torch.Tensor]],
                   encoded: dict[int, Encoded]) -> PromptImages:
    ids = torch.tensor([prompt])
    token_types = (ids == image_token_id(model)).int()
    grid = torch.stack([grid for _, _, grid in images])
    positions, delta = model.model.get_rope_index(ids, mm_token_type_ids=token_types, image_grid_thw=grid)
    delta = int(delta.reshape(-1)[0])
    if delta > 0:  # images never advance positions faster than their tokens; decode relies on it (cos tables)
        raise RolloutError(f"a prompt's M-RoPE positions run ahead of its tokens (delta {delta}): only images are "
                           "supported, not video")
    outputs = [encoded[name] for name, _, _ in images]
    deepstack = tuple(torch.cat(layer) for layer in zip(*(d for _, d in outputs)))
    return PromptImages(positions=positions[:, 0].cpu(), delta=delta, rows=token_types[0].nonzero().flatten(),
                        embeds=torch.cat([e for e, _ in outputs]), deepstack=deepstack,
                        names=tuple(name for (name, _, _), (e, _) in zip(images, outputs) for _ in range(e.shape[0])))
