"""The embedded model's autoencoder on a CPU: slices of frames and a copy-made upsampling, the same bit for bit.

``TinyVideo.encode`` / ``decode`` run the per-frame autoencoder over at most ``CPU_FRAME_SLICE`` frames at a
time and upsample by one broadcast copy (benchmarks/autoencoder_speed.py: about twice as fast), and a generation
request's image is encoded once instead of once per frame. Every shipped number (the demo's, the notebooks')
rests on their outputs being those of one whole call.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.backbones.tiny_video import TinyVideo
from workbench.backbones.tiny_video_networks import CPU_FRAME_SLICE, Upsample2x, per_frame


@pytest.fixture(scope="module")
def base():
    return TinyVideo.from_pretrained()


def whole(module: nn.Sequential) -> nn.Sequential:
    """``module`` as one call over every frame, with torch's own nearest upsampling."""
    return nn.Sequential(*[nn.Upsample(scale_factor=2, mode="nearest") if isinstance(m, Upsample2x) else m
                           for m in module])


@pytest.mark.parametrize("frames", [2, CPU_FRAME_SLICE + 1, 3 * CPU_FRAME_SLICE + 5])
def test_slices_decode_and_encode_what_one_call_does_bit_for_bit(base, frames):
    g = torch.Generator().manual_seed(frames)
    latents = torch.randn(frames, base.config.latent_channels, 16, 16, generator=g)
    pixels = torch.rand(frames, 3, 64, 64, generator=g) * 2 - 1
    with torch.no_grad():
        assert torch.equal(per_frame(base.autoencoder.decoder, latents), whole(base.autoencoder.decoder)(latents))
        assert torch.equal(per_frame(base.autoencoder.encoder, pixels), base.autoencoder.encoder(pixels))
        video = base.decode(latents.permute(1, 0, 2, 3)[None])  # one clip (1, C, T, h, w)
        frame_by_frame = whole(base.autoencoder.decoder)(base._denorm(latents)).clamp(-1, 1)
        assert torch.equal(video[0].permute(1, 0, 2, 3), frame_by_frame)


def test_no_slice_is_a_single_frame_and_training_takes_one_call(base):
    sizes: list[int] = []
    hook = base.autoencoder.decoder.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    try:
        with torch.no_grad():
            per_frame(base.autoencoder.decoder, torch.zeros(2 * CPU_FRAME_SLICE + 1, 4, 16, 16))
    finally:
        hook.remove()
    assert sizes == [11, 11, 11]  # 33 frames: three near-equal slices, never 16 + 16 + 1
    small = TinyVideo(image_size=16, frames=4, width=16, ae_width=8, depth=1)
    decoder, latents = small.autoencoder.decoder, torch.zeros(40, small.config.latent_channels, 4, 4)
    decoder.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    sizes.clear()
    per_frame(decoder.requires_grad_(False), latents)  # frozen, as a base is: sliced with autograd on too
    assert sizes == [14, 13, 13]
    sizes.clear()
    per_frame(decoder.requires_grad_(True), latents)  # training it: its gradients sum as one call sums them
    assert sizes == [40]


def test_the_copy_upsampling_is_torchs_nearest_in_values_and_in_gradients():
    x = torch.randn(3, 5, 7, 9, generator=torch.Generator().manual_seed(0))
    torch_up = nn.Upsample(scale_factor=2, mode="nearest")
    with torch.no_grad():
        assert torch.equal(Upsample2x()(x), torch_up(x))
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    weight = torch.randn(3, 5, 14, 18, generator=torch.Generator().manual_seed(1))
    (Upsample2x()(ours) * weight).sum().backward()
    (torch_up(theirs) * weight).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)


@pytest.mark.parametrize("clips", [1, 3])
def test_an_image_request_encodes_the_image_once_and_gives_the_latents_of_every_frame(base, clips):
    """A generation request holds one image for all 16 frames: it is encoded once (beside a copy, never as a batch
    of one frame) and its latent repeated, the same latents as encoding the 16 frames."""
    image = torch.rand(clips, 3, 64, 64, generator=torch.Generator().manual_seed(clips)) * 2 - 1
    encoded: list[int] = []
    hook = base.autoencoder.encoder.register_forward_pre_hook(lambda m, args: encoded.append(args[0].shape[0]))
    try:
        batch = base.prepare_batch({"image": image})
    finally:
        hook.remove()
    assert encoded == [2 * clips]
    every_frame = base.encode(image[:, :, None].expand(-1, -1, base.config.frames, -1, -1))
    assert torch.equal(batch.latents, every_frame) and torch.equal(batch.cond["first_frame"], every_frame[:, :, 0])
