"""Real architectures with random weights: built on the meta device, materialised once, deterministic.

On the tiny configurations a random-weight build has the normal build's parameter names, shapes and
dtypes (bf16, with the same float32 exceptions), finite values, the same values on a rebuild; under
``weights_on_meta`` the same structure with no storage. The shipped real configurations name the
released sizes.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import requires_plugins
from torch import nn

from workbench.backbones.random_weights import (
    empty_parameters,
    materialise,
    parameter_bytes,
    weights_on_meta,
)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 16)
        self.b.weight = self.a.weight  # shared
        self.norm = nn.LayerNorm(16)
        self.register_buffer("table", torch.arange(4.0))


def test_materialise_gives_each_parameter_one_deterministic_tensor():
    with empty_parameters():
        model = Tied()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert torch.equal(model.table, torch.arange(4.0))  # buffers are made as usual
    materialise(model, dtype=torch.bfloat16, seed=3)
    assert model.a.weight is model.b.weight  # still shared
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.norm.weight, torch.ones(16, dtype=torch.bfloat16))
    assert torch.equal(model.norm.bias, torch.zeros(16, dtype=torch.bfloat16))
    bound = 8**-0.5
    assert 0 < model.a.weight.float().abs().max() <= bound
    with empty_parameters():
        again = Tied()
    materialise(again, dtype=torch.bfloat16, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))
    with empty_parameters():
        other = Tied()
    materialise(other, dtype=torch.bfloat16, seed=4)
    assert not torch.equal(other.a.weight, model.a.weight)
    assert parameter_bytes(model) == (16 * 8 + 16 + 16 + 16 + 16) * 2 + 4 * 4  # a (shared weight), b bias, norm; table


def test_materialise_keeps_named_parameters_in_float32_and_refuses_meta_buffers():
    with empty_parameters():
        model = Tied()
    materialise(model, dtype=torch.bfloat16, float32=lambda name: name.startswith("norm."))
    assert model.norm.weight.dtype == torch.float32 and model.a.bias.dtype == torch.bfloat16
    with torch.device("meta"):
        broken = Tied()
    with pytest.raises(RuntimeError, match=r"buffers \['table'\] are on the meta device"):
        materialise(broken, dtype=torch.bfloat16)


def structure(module: nn.Module) -> dict[str, tuple]:
    return {name: (tuple(p.shape), p.dtype) for name, p in module.named_parameters()}


def check_same_architecture(normal: nn.Module, random: nn.Module, meta: nn.Module) -> None:
    assert structure(random) == structure(normal)
    assert structure(meta) == structure(normal)
    assert {n: tuple(b.shape) for n, b in random.named_buffers()} == {n: tuple(b.shape) for n, b in
                                                                     normal.named_buffers()}
    assert all(p.device.type == "meta" for p in meta.parameters())
    assert all(torch.isfinite(p.float()).all() for p in random.parameters())
    assert all(p.abs().sum() > 0 for n, p in random.named_parameters() if not n.endswith("bias"))  # none left 0


DIFFUSERS = [("wan22_ti2v", ("transformer", "vae")), ("easyanimate", ("transformer", "vae"))]


@requires_plugins
@pytest.mark.parametrize(("name", "parts"), DIFFUSERS)
def test_a_random_weight_build_is_the_normal_build_s_architecture(name, parts):
    from workbench.config import build

    config = {"path": "tiny", "device": "cpu", "dtype": "bfloat16"}
    normal = build("backbone", name, config)
    random = build("backbone", name, {**config, "random_weights": True})
    again = build("backbone", name, {**config, "random_weights": True})
    with weights_on_meta():
        meta = build("backbone", name, {**config, "random_weights": True})
    assert {p.dtype for p in random.transformer.parameters()} <= {torch.bfloat16, torch.float32}
    assert any(p.dtype == torch.bfloat16 for p in random.transformer.parameters())
    for part in parts:
        check_same_architecture(getattr(normal, part), getattr(random, part), getattr(meta, part))
        assert all(torch.equal(p, q) for p, q in zip(getattr(random, part).parameters(),
                                                     getattr(again, part).parameters(), strict=True))
    assert random.card.components["transformer"].parameters == normal.card.components["transformer"].parameters
    assert random.card.components["transformer"].source.startswith("random weights (seed 0)")
    assert parameter_bytes(meta) == parameter_bytes(random)
    x = torch.randn(1, normal.latent_channels, 3, 4, 4)
    batch = {"latents": x, "prompt_embeds": torch.randn(1, 6, normal.transformer.config.text_dim if name ==
                                                         "wan22_ti2v" else normal.transformer.config.text_embed_dim)}
    if name == "wan22_ti2v":
        batch["first_frame"] = x[:, :, 0]
    prepared = random.prepare_batch(batch)
    out = random.denoise(prepared.latents, torch.tensor([0.5]), prepared.cond)
    assert out.shape == x.shape and torch.isfinite(out).all()


@requires_plugins
def test_a_random_weight_dynamicrafter_is_the_checkpoint_s_architecture():
    from workbench.config import build

    config = {"path": "tiny", "device": "cpu", "dtype": "bfloat16"}
    normal = build("backbone", "dynamicrafter", config)
    random = build("backbone", "dynamicrafter", {**config, "random_weights": True})
    with weights_on_meta():
        meta = build("backbone", "dynamicrafter", {**config, "random_weights": True})
        meta_towers = meta.conditioning
    check_same_architecture(normal.model, random.model, meta.model)
    check_same_architecture(normal.conditioning, random.conditioning, meta_towers)
    assert random.model.parameter_counts() == normal.model.parameter_counts()
    # the U-Net's float32 GroupNorms stay float32, as a checkpoint load keeps them
    assert random.model.unet.out[0].weight.dtype == torch.float32


@requires_plugins
def test_the_shipped_real_configurations_name_the_released_sizes():
    from workbench_dynamicrafter.model import REAL
    from workbench_dynamicrafter.variants import Sizes

    doc = json.loads((REAL / "512.json").read_text())
    assert doc["variant"] == "512"
    expected = {f.name: getattr(Sizes(), f.name) for f in dataclasses.fields(Sizes)}
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in doc["sizes"].items()} == expected
    from workbench.config import build

    with weights_on_meta():
        dc = build("backbone", "dynamicrafter", {"path": "real", "random_weights": True, "device": "cpu",
                                                  "dtype": "bfloat16"})
        wan = build("backbone", "wan22_ti2v", {"path": "real", "random_weights": True, "device": "cpu",
                                               "dtype": "bfloat16"})
        ea = build("backbone", "easyanimate", {"path": "real", "random_weights": True, "device": "cpu",
                                               "dtype": "bfloat16"})
    assert sum(p.numel() for p in ea.transformer.parameters()) == 11_799_056_960  # the 12B release's 23.6 GB
    assert sum(p.numel() for p in ea.vae.parameters()) == 244_375_507  # its 986 MB float32 VAE
    assert dc.model.parameter_counts()["unet"] == 1_438_854_980  # 1438.9 M, as the release's keys say
    assert sum(p.numel() for p in wan.transformer.parameters()) == 4_999_787_712  # "about 5.0 B"
    assert wan.vae.config.z_dim == 48 and wan.transformer.config.num_layers == 30
    assert not wan.has_text_encoder  # the UMT5 encoder is left out of the shipped configuration


@requires_plugins
@pytest.mark.parametrize("name", ["wan22_ti2v", "easyanimate", "dynamicrafter"])
def test_the_real_configuration_needs_random_weights(name):
    from workbench.config import build
    from workbench.errors import CheckpointError

    with pytest.raises(CheckpointError, match="random_weights: true"):
        build("backbone", name, {"path": "real", "device": "cpu"})
