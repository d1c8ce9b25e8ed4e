"""The tiny preview: a small decoder distilled from the backbone's own, against the linear preview and the
full decode; its cache; wrong inputs; the 48-channel causal Wan2.2 latents."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import count_decodes, requires_plugins, tiny_base

from workbench.errors import InspectError
from workbench.inspect import clear_preview_cache, fit_preview, render
from workbench.inspect.previews.preview_cache import backbone_identity
from workbench.inspect.previews.tiny_preview import MAX_PARAMETERS, TinyPreview
from workbench.metrics import psnr

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def cache(preview_cache):
    return preview_cache


@pytest.fixture(scope="module")
def pretrained():
    from workbench.backbones.tiny_video import TinyVideo

    return TinyVideo.from_pretrained()


@pytest.fixture(scope="module")
def heldout_clips(pretrained):
    """Six held-out Meta-World clips encoded by the pretrained base, and their full decodes."""
    from workbench.data.metaworld import MetaWorldClips

    clips = MetaWorldClips(path="sample", window=8, stride=48, split="val")
    video = torch.stack([clips[i]["video"] for i in range(6)])  # (6, 3, 8, 64, 64)
    with torch.no_grad():
        z = pretrained.encode(video)
        return z, pretrained.decode(z)


def test_the_shipped_tiny_preview_is_the_pretrained_base_s_compiled_or_not(pretrained):
    """A field that does not change the decoder (compile, device, dtype) leaves the identity alone, so the
    preview shipped next to the weights is found instead of distilled again (40 s on first view)."""
    from workbench.backbones.tiny_video import WEIGHTS_DIR
    from workbench.config import build

    shipped = json.loads((WEIGHTS_DIR / "tiny_video.tiny_preview.json").read_text())["identity"]
    assert backbone_identity(pretrained) == shipped
    assert backbone_identity(build("backbone", "tiny_video", {"weights": "pretrained", "compile": True})) == shipped


def test_the_shipped_tiny_preview_beats_linear_by_six_db_on_held_out_clips(pretrained, heldout_clips):
    calls = count_decodes(pretrained)
    try:
        tiny = fit_preview(pretrained, kind="tiny")  # shipped next to the weights: nothing is distilled here
    finally:
        del pretrained.decode  # the module fixture is shared
    assert calls == [0]
    assert isinstance(tiny, TinyPreview) and tiny.source == "data-free"
    assert tiny.parameters <= MAX_PARAMETERS
    z, full = heldout_clips
    linear = fit_preview(pretrained, cache=False)
    p_tiny, p_linear = psnr(tiny(z), full, data_range=255.0), psnr(linear(z), full, data_range=255.0)
    assert p_tiny >= p_linear + 6  # measured 27.5 vs 17.9 dB
    assert tiny.psnr >= tiny.linear_psnr + 6  # its own held-out data-free latents: measured 26.4 vs 18.3 dB


def test_a_short_distillation_beats_linear_on_held_out_latents(pretrained, heldout_clips):
    calls = count_decodes(pretrained)
    try:
        tiny = fit_preview(pretrained, kind="tiny", n_fit=6, n_heldout=2, steps=120, seed=0, cache=False)
    finally:
        del pretrained.decode  # the module fixture is shared
    assert calls[0] == 4 * 6 + 4 * 2  # four decoded sets (random, re-encoded once, twice, noised) of each
    assert tiny.n_fit == 4 * 6 and tiny.n_heldout == 4 * 2
    assert tiny.psnr > tiny.linear_psnr + 3  # data-free held-out latents (measured 23.4 vs 18.4 dB)
    z, full = heldout_clips
    linear = fit_preview(pretrained, cache=False)
    assert psnr(tiny(z), full, data_range=255.0) > psnr(linear(z), full, data_range=255.0) + 3  # 25.4 vs 17.9 dB


def test_a_refit_with_the_same_seed_distils_the_same_weights(pretrained):
    first, again = (fit_preview(pretrained, kind="tiny", n_fit=2, n_heldout=1, steps=8, seed=3, cache=False,
                                refit=True) for _ in range(2))
    assert first is not again
    assert all(torch.equal(a, b) for a, b in zip(first.net.state_dict().values(), again.net.state_dict().values()))


def test_a_cache_hit_returns_identical_weights_without_decoding(cache):
    first = tiny_base()
    tiny = fit_preview(first, kind="tiny", n_fit=2, n_heldout=1, steps=5)
    identity = backbone_identity(first)
    meta = json.loads((cache / f"tiny-{identity}.json").read_text())
    assert meta["kind"] == "tiny" and meta["psnr"] == pytest.approx(tiny.psnr)
    clear_preview_cache()  # memory only: the disk copy stays
    second = tiny_base()  # same weights: the same identity
    calls = count_decodes(second)
    loaded = fit_preview(second, kind="tiny")
    assert calls[0] == 0
    assert loaded is not tiny and loaded.psnr == pytest.approx(tiny.psnr)
    saved, back = tiny.net.state_dict(), loaded.net.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    assert fit_preview(second, kind="tiny") is loaded  # then from memory


def test_render_with_the_tiny_preview_is_the_preview_applied(cache):
    base = tiny_base()
    tiny = fit_preview(base, kind="tiny", n_fit=2, n_heldout=1, steps=5)
    z = torch.randn(1, 4, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    frames = render(base, z, decode="tiny")
    expected = ((tiny(z)[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).byte().numpy()
    assert frames.shape == (4, 16, 16, 3) and abs(frames.astype(int) - expected.astype(int)).max() <= 1


@pytest.mark.parametrize("shape", [(1, 3, 4, 4, 4), (4, 4, 4, 4), (1, 8, 2, 4, 4)])
def test_wrong_shape_latents_are_refused_with_the_fix(cache, shape):
    tiny = fit_preview(tiny_base(), kind="tiny", n_fit=2, n_heldout=1, steps=2)
    with pytest.raises(InspectError, match=r"decodes 4-channel latents \(B, C, T, h, w\); got shape "
                                            + rf"\({', '.join(map(str, shape))}\)\. Distil one for this backbone "
                                              r"with fit_preview\(base, kind='tiny'\)"):
        tiny(torch.zeros(shape))


def test_unknown_kinds_and_misplaced_settings_are_refused(cache):
    with pytest.raises(InspectError, match=r"fit_preview\(kind='tiniest'\): unknown preview kind\. Allowed: "
                                           r"linear, tiny"):
        fit_preview(tiny_base(), kind="tiniest")
    with pytest.raises(InspectError, match=r"takes no distillation settings; got \['steps'\]\. They apply to "
                                           r"kind='tiny'"):
        fit_preview(tiny_base(), steps=10)
    with pytest.raises(InspectError, match=r"width=512 .* over the 1,000,000 allowed\. Pass a smaller width "
                                           r"\(e\.g\. width=256\)"):
        fit_preview(tiny_base(), kind="tiny", n_fit=1, n_heldout=1, steps=1, width=512, cache=False)


@requires_plugins
def test_the_tiny_preview_decodes_wans_48_channel_causal_latents(tmp_path, monkeypatch):
    import workbench_wan22.tiny

    from workbench.config import build

    root = tmp_path / "wan"
    workbench_wan22.tiny.save_tiny_pipeline(root)
    base = build("backbone", "wan22_ti2v", {"path": str(root), "height": 64, "width": 64, "num_frames": 9,
                                            "steps": 4, "prompt": "a robot arm"})
    tiny = fit_preview(base, kind="tiny", latent_shape=(48, 3, 4, 4), n_fit=2, n_heldout=1, steps=40, cache=False)
    assert (tiny.net.channels, tiny.net.d, tiny.net.r, tiny.net.causal) == (48, 16, 4, True)
    assert tiny.parameters <= MAX_PARAMETERS
    z = torch.randn(1, 48, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    assert tiny(z).shape == (1, 3, 9, 64, 64)  # 1 + 4 (T' - 1) frames, like the causal VAE
    assert tiny(z[:, :, :1]).shape == (1, 3, 1, 64, 64)
    assert tiny.psnr >= tiny.linear_psnr - 0.5  # it starts at the linear preview and trains towards the decoder
