"""SigLIP vision tower (built from a config, never downloaded) and its projector."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import SiglipVisionConfig, SiglipVisionModel

from .config import VisionConfig
from .gemma import GeluTanh


class VisionEncoder(nn.Module):
    """Images -> one token per patch, projected to the VLM width.

    π0.5 takes SigLIP's last hidden state (after its final layer norm) and a
    linear projector; it does not rescale the image features.
    """

    def __init__(self, cfg: VisionConfig, out_width: int):
        super().__init__()
        self.cfg = cfg
        hf = SiglipVisionConfig(
            hidden_size=cfg.hidden,
            intermediate_size=cfg.mlp,
            num_hidden_layers=cfg.depth,
            num_attention_heads=cfg.heads,
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            num_channels=3,
            hidden_act="gelu_pytorch_tanh",
            layer_norm_eps=1e-6,
            vision_use_head=False,
        )
        hf._attn_implementation = "sdpa"
        self.tower = SiglipVisionModel(hf)
        for layer in self.tower.encoder.layers:  # the same function, faster compiled
            layer.mlp.activation_fn = GeluTanh()
        self.projector = nn.Linear(cfg.hidden, out_width)

    def forward(self, pixels: Tensor) -> Tensor:
        """pixels [N, 3, S, S], the camera's uint8 colour planes or floats already in [-1, 1]
        -> [N, tokens_per_image, out_width].

        uint8 planes are normalised here (:func:`planes_to_pixels`): a compiled prefill does
        it inside its graph, and a GPU's copy of the images is a quarter of the floats'.
        The patch and position embeddings run in their own dtype (float32 when
        the model runs in bfloat16, as openpi keeps them); the encoder, its
        final norm and the projector run in the model dtype.
        """
        if pixels.dtype == torch.uint8:
            pixels = planes_to_pixels(pixels)
        tower = self.tower
        dtype = self.projector.weight.dtype
        embedded = tower.embeddings(pixels.to(tower.embeddings.patch_embedding.weight.dtype))
        hidden = tower.encoder(inputs_embeds=embedded.to(dtype)).last_hidden_state
        return self.projector(tower.post_layernorm(hidden))


def images_to_pixels(images: Tensor) -> Tensor:
    """uint8 [..., S, S, 3] -> float [..., 3, S, S] in [-1, 1], as π0.5 normalises."""
    return planes_to_pixels(images.movedim(-1, -3))


def planes_to_pixels(planes: Tensor) -> Tensor:
    """uint8 [..., 3, S, S] (colour planes) -> float [..., 3, S, S] in [-1, 1], contiguous: a
    caller that lays its images out as planes already saves the strided conversion."""
    return planes.to(torch.float32, memory_format=torch.contiguous_format).div_(127.5).sub_(1.0)
