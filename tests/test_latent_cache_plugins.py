"""`workbench cache-latents` on every shipped plugin backbone, and training fed from the cache.

Each backbone's ``encode_item`` does the frozen work it can do ahead (the VAE's latents of the clip
and of its given frames, the text embeddings, DynamiCrafter's CLIP text + image context): the
example configs cache as written, a run trained from the cache equals one trained on the raw
clips bit for bit, and the run fed from the cache never loads the text encoder (DynamiCrafter: its
conditioning towers).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from conftest import requires_plugins

pytestmark = requires_plugins

from workbench.cli import main  # noqa: E402
from workbench.train.experiment import AdapterExperiment  # noqa: E402
from workbench.train.latent_store import DiskLatentCache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["wan22_lora", "easyanimate", "dynamicrafter"]


def config(tmp_path: Path, example: str, **training) -> Path:
    """The example config as written, on 24 clips (one every 32 frames of the sample's val split) and a
    short run."""
    cfg = yaml.safe_load((ROOT / "examples" / "configs" / f"{example}.yaml").read_text())
    cfg["data"]["config"].update(split="val", stride=32)
    cfg["training"] = {"steps": 2, "learning_rate": 1.0e-2, "batch_size": 2, "sync_every": 1, "progress": False,
                       "seed": 3, **training}
    cfg.pop("callbacks", None)
    path = tmp_path / f"{example}-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def text_encoder_loaded(base) -> bool:
    flag = "conditioning_loaded" if hasattr(base, "conditioning_loaded") else "text_encoder_loaded"
    return getattr(base, flag)


@pytest.mark.parametrize("example", EXAMPLES)
def test_training_from_the_cache_equals_training_on_the_clips_and_never_loads_the_text_encoder(
        example, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "workbench-cache"))  # the tiny models, built once here
    cache = tmp_path / "cache"
    assert main(["cache-latents", str(config(tmp_path, example)), "--out", str(cache), "--shard-size", "8"]) == 0
    items = DiskLatentCache(cache)
    assert len(items) == 24 and "video" not in items[0] and "latents" in items[0]

    plain = AdapterExperiment.from_yaml(config(tmp_path, example, output_dir=str(tmp_path / "plain")))
    plain.fit(steps=2)
    cached = AdapterExperiment.from_yaml(config(tmp_path, example, cache_latents=str(cache),
                                                output_dir=str(tmp_path / "cached")))
    cached.fit(steps=2)
    assert cached.loss_history == plain.loss_history
    a, b = cached.model.trainable_state_dict(), plain.model.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert text_encoder_loaded(plain.model.base)  # the raw clips' prompts went through it
    assert not text_encoder_loaded(cached.model.base)  # the cache carried the embeddings: never loaded
    held = {".".join(name.split(".")[:2 if name.startswith("model.") else 1])
            for name, _ in cached.model.base.named_parameters()}
    assert held in ({"transformer", "vae"}, {"model.unet", "model.vae"})  # the denoiser, and the VAE to decode


def test_each_cached_item_is_what_prepare_batch_makes_of_its_clip(tmp_path, monkeypatch):
    """Collated cache items prepare to the batch their raw clips prepare to, bit for bit (Wan2.2: the clip's
    latents, its first frame's latent and pixels, the prompt's embeddings)."""
    from workbench.config import build

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "workbench-cache"))
    cfg = yaml.safe_load((ROOT / "examples" / "configs" / "wan22.yaml").read_text())
    base = build("backbone", "wan22_ti2v", cfg["base"]["config"])
    data = build("dataset", "metaworld", {**cfg["data"]["config"], "split": "val", "stride": 32})
    raw_items = [data[i] for i in range(3)]
    encoded = [base.encode_item(it) for it in raw_items]
    assert sorted(encoded[0]) == sorted([*(k for k in raw_items[0] if k != "video"), "latents", "prompt_embeds",
                                         "first_frame", "image"])

    def collate(items):
        return {k: torch.stack([it[k] for it in items]) if isinstance(items[0][k], torch.Tensor)
                else [it[k] for it in items] for k in items[0]}

    a, b = base.prepare_batch(collate(raw_items)), base.prepare_batch(collate(encoded))
    assert torch.equal(a.latents, b.latents) and torch.equal(a.loss_mask, b.loss_mask)
    assert sorted(a.cond) == sorted(b.cond) and all(torch.equal(a.cond[k], b.cond[k]) for k in a.cond)
    no_first = {k: v for k, v in collate(encoded).items() if k != "first_frame"}
    with pytest.raises(Exception, match=r"a batch of 'latents' needs the first frame's latent 'first_frame' "
                                        r"\(B, 48, h, w\) beside them, as encode_item makes it"):
        base.prepare_batch(no_first)
