"""Latent previews: the least-squares fit against the backbone's own decoder, its disk cache,
pixel-space backbones, chunked full decode, and the frames / export a view renders."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import count_decodes, raw_batch, tiny_base
from torch import nn

from workbench import BaseVideoModel, ComponentSpec, ComposedModel, GatedResidual, ModelCard
from workbench.adapters.latent_residual import LatentResidual
from workbench.core.capabilities import LatentLayout, Previews
from workbench.errors import InspectError, StepError
from workbench.inspect import clear_preview_cache, fit_preview, record, render
from workbench.inspect.previews.latent_space import decode_chunked
from workbench.inspect.previews.linear_preview import identity_preview
from workbench.inspect.previews.preview_cache import backbone_identity
from workbench.metrics import to_uint8_video


@pytest.fixture(autouse=True)
def cache(preview_cache):
    return preview_cache


class LinearVAE(BaseVideoModel, Previews):
    """A backbone whose decoder is exactly linear per latent pixel (a strided transposed conv), with
    ``r`` frames per latent frame, optionally causal (latent frame 0 decodes to one frame)."""

    def __init__(self, channels=4, d=2, r=1, causal=False, pixel_space=None):
        super().__init__()
        torch.manual_seed(0)
        self.rest = nn.ConvTranspose3d(channels, 3, (r, d, d), stride=(r, d, d))
        self.first = nn.ConvTranspose3d(channels, 3, (1, d, d), stride=(1, d, d)) if causal else None
        self.causal = causal
        if pixel_space is not None:
            self.pixel_space = pixel_space
        self.card = ModelCard(model_id="linear", family="linear", prediction_type="velocity",
                              components={"denoiser": ComponentSpec("denoiser"), "vae": ComponentSpec("vae")})

    def decode(self, latents):
        if not self.causal:
            return self.rest(latents) * 0.3
        return torch.cat([self.first(latents[:, :, :1]), self.rest(latents[:, :, 1:])], dim=2) * 0.3


@pytest.mark.parametrize("r, causal", [(1, False), (2, False), (2, True)])
def test_an_exactly_linear_decoder_is_recovered(r, causal):
    base = LinearVAE(r=r, causal=causal)
    preview = fit_preview(base, latent_shape=(4, 3, 4, 4), cache=False)
    assert (preview.downsample, preview.frames_per_latent, preview.causal) == (2, r, causal)
    z = torch.randn(2, 4, 3, 4, 4, generator=torch.Generator().manual_seed(9)) * 0.5
    with torch.no_grad():
        full = base.decode(z).clamp(-1, 1)
    assert preview(z).shape == full.shape
    assert torch.allclose(preview(z), full, atol=1e-4)
    assert preview.psnr > 70 and preview.baseline_psnr < 30


def test_tiny_video_preview_is_the_least_squares_fit_and_beats_a_constant():
    from workbench.backbones.tiny_video import TinyVideo
    from workbench.data.metaworld import MetaWorldClips

    base = TinyVideo.from_pretrained()  # a real decoder: far from linear, and far from constant
    preview = fit_preview(base, cache=False)
    assert preview.source == "data-free" and preview.channels == 4 and preview.downsample == 4
    assert preview.psnr > preview.baseline_psnr + 2 and 15 < preview.psnr < 60  # measured 18.6 vs 15.6 dB
    clips = MetaWorldClips(path="sample", window=4, stride=48, split="val")
    video = torch.stack([clips[i]["video"] for i in range(6)])  # (6, 3, 4, 64, 64) real frames
    samples = fit_preview(base, samples=video, cache=False)
    assert samples.source == "samples" and (samples.n_fit, samples.n_heldout) == (2, 4)
    assert samples.psnr > samples.baseline_psnr + 5 and samples.psnr > 19  # measured 20.6 vs 13.7 dB
    assert "dB held-out vs full decode" in repr(samples)


def test_the_fit_is_cached_on_disk_per_backbone_identity(cache):
    first = tiny_base()
    calls = count_decodes(first)
    fitted = fit_preview(first)
    assert calls[0] == fitted.n_fit + fitted.n_heldout  # one decode per fit clip
    identity = backbone_identity(first)
    meta = json.loads((cache / f"{identity}.json").read_text())
    assert (cache / f"{identity}.safetensors").exists() and meta["psnr"] == pytest.approx(fitted.psnr)
    clear_preview_cache()  # memory only: the disk copy stays
    second = tiny_base()  # same seed, same weights: a new object with the same identity
    calls = count_decodes(second)
    loaded = fit_preview(second)
    assert calls[0] == 0
    assert torch.equal(loaded.weight, fitted.weight) and loaded.psnr == pytest.approx(fitted.psnr)
    assert backbone_identity(tiny_base(ae_width=16)) != identity  # another decoder, another cache entry


def test_a_fit_on_samples_serves_this_process_and_never_reaches_the_disk(cache):
    base = tiny_base()
    video = torch.rand(3, 3, 4, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    fitted = fit_preview(base, samples=video)
    assert fitted.source == "samples" and not list(cache.glob("*"))  # nothing written
    assert fit_preview(base) is fitted  # ... but this process's views use it
    clear_preview_cache()
    assert fit_preview(base).source == "data-free" and len(list(cache.glob("*.safetensors"))) == 1


def test_the_ridge_keeps_an_underdetermined_fit_finite():
    """One latent pixel seen twice cannot pin down C + 1 weights per output pixel: plain least
    squares fits the noise with huge weights; the ridge keeps them of the order of the data, and
    still reproduces a well-posed linear map."""
    from workbench.inspect.previews.linear_preview import solve_linear

    gen = torch.Generator().manual_seed(3)
    z = torch.randn(1, 4, 1, 1, 1, generator=gen).repeat(2, 1, 1, 1, 1)
    z = z + 1e-7 * torch.randn(z.shape, generator=gen)
    video = torch.rand(2, 3, 1, 2, 2, generator=gen) * 2 - 1  # unrelated targets: only noise to fit
    weight, _ = solve_linear(z, video, 2, 1)
    plain = torch.linalg.lstsq(torch.cat([z.flatten(1), torch.ones(2, 1)], 1).double(),
                               video.flatten(1).double()).solution
    assert torch.isfinite(weight).all() and weight.abs().max() < 10 < plain.abs().max()
    base = LinearVAE(r=1, causal=False)
    wide = torch.randn(64, 4, 1, 4, 4, generator=gen)
    with torch.no_grad():
        out = base.decode(wide)
    weight, _ = solve_linear(wide, out, 2, 1)
    from workbench.inspect.previews.linear_preview import _blocks, _design
    assert torch.allclose(_design(wide).float() @ weight, _blocks(out, 2, 1).float(), atol=1e-3)


def test_pixel_space_backbones_preview_directly():
    base = LinearVAE(channels=3, d=1, pixel_space=True)
    latents = torch.rand(1, 3, 2, 4, 4) * 2 - 1
    frames = render(base, latents)
    assert np.array_equal(frames, to_uint8_video(latents[0]))
    assert fit_preview(base, latent_shape=(3, 2, 4, 4)).source == "identity"
    assert identity_preview().psnr == float("inf")


def test_full_decode_is_chunked_along_time():
    base = tiny_base(frames=6)
    z = torch.randn(1, 4, 6, 4, 4, generator=torch.Generator().manual_seed(0))
    calls = count_decodes(base)
    chunked = decode_chunked(base, z, chunk_frames=4)
    assert calls[0] == 2
    assert torch.allclose(chunked, decode_chunked(base, z, chunk_frames=None), atol=1e-6)
    with pytest.raises(InspectError, match="chunk_frames must be a positive int or None, got 0"):
        decode_chunked(base, z, chunk_frames=0)


class StatefulCausalVAE(LinearVAE, LatentLayout):
    """A causal video VAE as the real ones decode: latent frame 0 of every call gives one frame, and each
    later frame also sees the running mean of the frames before it in the same call (a feature cache)."""

    causal_latents = True

    def decode(self, latents):
        video = super().decode(latents)
        history = video.cumsum(dim=2) / torch.arange(1, video.shape[2] + 1).view(1, 1, -1, 1, 1)
        return video + 0.1 * history


def test_a_causal_video_vae_is_decoded_whole_never_in_chunks():
    base = StatefulCausalVAE(r=2, causal=True)
    z = torch.randn(1, 4, 10, 4, 4, generator=torch.Generator().manual_seed(0))  # 10 latent frames → 19 frames
    with torch.no_grad():
        whole = base.decode(z)
    calls = count_decodes(base)
    decoded = decode_chunked(base, z)  # the default chunk (8 latent frames) would give 15 + 3 frames, restarted
    assert calls[0] == 1 and decoded.shape == whole.shape == (1, 3, 19, 8, 8)
    assert torch.equal(decoded, whole)
    assert torch.equal(decode_chunked(base, z, chunk_frames=2), whole)
    assert np.array_equal(render(base, z, decode="full"), to_uint8_video(whole[0].clamp(-1, 1)))


@pytest.fixture
def traj():
    base = tiny_base()
    model = ComposedModel(base, LatentResidual(width=16, depth=1), GatedResidual(gate_init=0.5),
                          base.default_objective())
    return record(model, raw_batch(), steps=3, seed=0)


def test_frames_of_every_kind(traj):
    for kind in ("x0", "x_t", "base", "adapter", "composed"):
        frames = traj.frames(1, kind=kind)
        assert frames.shape == (4, 16, 16, 3) and frames.dtype == np.uint8
    full = traj.frames("final", decode="full", index=1)
    with torch.no_grad():
        expected = to_uint8_video(traj.model.base.decode(traj.final[1:2])[0])
    assert np.array_equal(full, expected)
    assert not np.array_equal(traj.frames(0, "x_t"), traj.frames(0, "x_t", index=1))


@pytest.mark.parametrize("call, error, message", [
    (lambda t: t.frames(1, kind="compose"), InspectError,
     r"kind='compose' is not allowed; allowed: 'x_t', 'x0', .*Did you mean 'composed'\? Pick what to show"),
    (lambda t: t.frames(1, decode="vae"), InspectError,
     r"decode='vae' is not allowed; allowed: 'preview', 'tiny', 'full'"),
    (lambda t: t.frames(9), StepError, r"step=9 is out of range: this trajectory has 3 recorded steps"),
    (lambda t: t.frames("last"), StepError, r"step='last': use an int step index or 'final'"),
    (lambda t: t.frames(0, index=2), InspectError, r"index=2 is not a batch element; this batch has 2 \(0..1\)"),
])
def test_frames_error_wording(traj, call, error, message):
    with pytest.raises(error, match=message):
        call(traj)


def test_export_writes_a_labelled_steps_by_branches_grid(traj, tmp_path):
    import imageio.v3 as iio

    fork = traj.fork(at=1, with_adapter=False)
    path = traj.export(tmp_path / "grid.gif", branches=[fork], scale=2)
    video = iio.imread(path, index=None)
    assert video.shape[0] == 4 and video.shape[-1] in (3, 4)
    assert video.shape[2] > 2 * 2 * 16  # two labelled columns of 32-pixel clips
    assert fork.label == "fork@1: adapter off"


def test_importing_the_inspection_layer_stays_light():
    code = ("import sys, workbench; assert 'workbench.inspect' not in sys.modules; import workbench.inspect; "
            "print([m for m in ('imageio', 'PIL', 'matplotlib', 'ipywidgets', 'h5py') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_export_refuses_non_trajectories(traj, tmp_path):
    with pytest.raises(InspectError, match="export branches must be Trajectory objects"):
        traj.export(tmp_path / "x.gif", branches=["fork"])


def test_a_decoder_that_is_not_rgb_is_refused():
    class FourChannels(LinearVAE):
        def decode(self, latents):
            return latents

    with pytest.raises(InspectError, match=r"base.decode returned 4 channels \(shape \(12, 4, 1, 2, 2\)\); a preview"):
        fit_preview(FourChannels(), latent_shape=(4, 1, 2, 2), cache=False)
