"""training.cache_latents: the frozen encoder runs once per item, and training sees the same latents."""

from __future__ import annotations

import pytest
import torch
from conftest import ToyBackbone, tiny_base, toy_raw

from workbench import AdapterExperiment, GatedResidual, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.data.synthetic import SyntheticMoves
from workbench.errors import ConfigError, DataError
from workbench.train.data import LatentCache


def count_encodes(base) -> list[int]:
    calls = [0]
    encode = base.encode

    def counted(video):
        calls[0] += len(video)
        return encode(video)

    base.encode = counted
    return calls


def experiment(cache: bool) -> AdapterExperiment:
    base = tiny_base(frames=8)
    torch.manual_seed(0)
    return AdapterExperiment(base, LatentResidual(width=8, depth=1), GatedResidual(),
                             training=TrainingConfig(batch_size=4, learning_rate=1e-3, cache_latents=cache,
                                                     progress=False, sync_every=1))


def test_encode_item_latents_prepare_like_the_video_they_came_from():
    base = tiny_base(frames=8)
    data = SyntheticMoves(items=3, frames=8, size=16)
    items = [data[i] for i in range(3)]
    video = {"video": torch.stack([it["video"] for it in items]), "action": torch.stack([it["action"] for it in items])}
    encoded = [base.encode_item(it) for it in items]
    assert "video" not in encoded[0] and encoded[0]["latents"].shape == (4, 8, 4, 4)
    cached = {"latents": torch.stack([e["latents"] for e in encoded]), "action": video["action"]}
    a, b = base.prepare_batch(video), base.prepare_batch(cached)
    torch.testing.assert_close(b.latents, a.latents, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.cond["first_frame"], a.cond["first_frame"], atol=1e-6, rtol=0)
    assert torch.equal(b.loss_mask, a.loss_mask) and b.meta["has_target"]


def test_the_encoder_runs_once_per_item_and_training_matches_the_uncached_run():
    data = SyntheticMoves(items=8, frames=8, size=16)
    plain, cached = experiment(False), experiment(True)
    plain_calls, cached_calls = count_encodes(plain.model.base), count_encodes(cached.model.base)
    plain.fit(data, steps=6)  # three epochs of two batches
    cached.fit(data, steps=6)
    assert plain_calls[0] == 6 * 4
    assert cached_calls[0] == 8  # each item once
    assert cached.loss_history == pytest.approx(plain.loss_history, rel=1e-4)
    cached.fit(data, steps=2)  # a second fit reuses the cache and the stream position
    assert cached_calls[0] == 8 and cached.step == 8
    cached.evaluate(data, batches=2)  # evaluation on the same dataset reads the same cache
    assert cached_calls[0] == 8


def test_cache_latents_needs_the_training_process():
    with pytest.raises(ConfigError, match="cache_latents: needs num_workers: 0 .* got num_workers: 2"):
        TrainingConfig(cache_latents=True, num_workers=2)


def test_a_backbone_without_a_latent_cache_is_named():
    with pytest.raises(DataError, match=r"^training\.cache_latents: ToyBackbone does not declare CachesLatents, so it "
                                        r"has no frozen work to do ahead of training\. Set cache_latents: false, or "
                                        r"declare CachesLatents on the backbone with its encode_item\(item\)\.$"):
        LatentCache([toy_raw()], ToyBackbone())


def test_latents_of_the_wrong_shape_are_refused():
    base = tiny_base()
    with pytest.raises(DataError, match=r"'latents' must be float \(B, 4, T, 4, 4\) .* got \(2, 4, 4, 8, 8\)"):
        base.prepare_batch({"latents": torch.zeros(2, 4, 4, 8, 8)})
