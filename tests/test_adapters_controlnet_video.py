"""ControlNet fed a control video (edges, depth, ...) instead of per-frame vectors.

The control video travels as the raw batch's ``"control"`` ``(B, C, T, H, W)``, reaches the
adapter as a declared video condition, and is embedded on the first copied block's grid in each
hidden-state layout (tiny_video's channels, Wan's tokens, DynamiCrafter's frames-in-batch).
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_resume_is_bit_exact, perturb, raw_batch, requires_plugins, tiny_base

from workbench import AdapterExperiment, ComposedModel, Replace, TrainingConfig
from workbench.adapters.controlnet import ControlNet, block_grid
from workbench.config import build
from workbench.core.conditions import Condition
from workbench.data.control import edges
from workbench.errors import CompositionError, ConditionError, ConfigError, DataError
from workbench.testing import INSIDE_PROMISES, check_inside_adapter


def video_controlnet(**overrides) -> ControlNet:
    torch.manual_seed(1)
    return ControlNet(**{"condition": "control", "video": True, "dim": 1, "aliases": (), **overrides})


def with_control(raw: dict, channels: int = 1, seed: int = 5) -> dict:
    b, _, t, h, w = raw["video"].shape
    g = torch.Generator().manual_seed(seed)
    return {**raw, "control": torch.rand(b, channels, t, h, w, generator=g) * 2 - 1}


# -- the promises, on each layout ------------------------------------------------------------
def test_a_video_controlnet_keeps_the_inside_adapter_promises_on_tiny_video():
    report = check_inside_adapter(tiny_base, video_controlnet, raw=with_control(raw_batch()), steps=3)
    assert [f.promise for f in report.findings] == list(INSIDE_PROMISES) and report.ok
    assert report["recording"].detail == "3 steps, 2 base calls per step recorded (1 sampling), bit-exact"


class MovesWithEdges(torch.utils.data.Dataset):
    """Moving squares, each clip with its edge video as ``control``."""

    def __init__(self):
        from workbench.data.synthetic import SyntheticMoves

        self.items = [{**it, "control": edges(it["video"])} for it in SyntheticMoves(items=16, frames=4, size=16)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_resume_of_a_video_controlnet_is_bit_exact(tmp_path):
    def make(out=None):
        torch.manual_seed(1)
        training = dict(steps=8, learning_rate=2e-2, batch_size=4, sync_every=2, progress=False)
        return AdapterExperiment(base=tiny_base(), adapter=video_controlnet(),
                                 training=TrainingConfig(**training, **({"output_dir": str(out)} if out else {})))

    assert_resume_is_bit_exact(make, MovesWithEdges(), tmp_path)


def test_the_control_video_reaches_the_adapted_prediction_and_only_it():
    base = tiny_base()
    model = ComposedModel(base, video_controlnet(), Replace(), base.default_objective()).train(False)
    raw = with_control(raw_batch())
    batch = base.prepare_batch(raw)
    x_t, t, _ = model.noised(batch, torch.Generator().manual_seed(2))
    with torch.no_grad():
        at_init = model.predict(x_t, t, batch)
        assert torch.equal(at_init.composed, tiny_base().denoise(x_t, t, batch.cond))  # zero projections: the base
        perturb(model)
        one = model.predict(x_t, t, batch)
        other = model.predict(x_t, t, base.prepare_batch(with_control(raw_batch(), seed=6)))
    assert torch.equal(one.base, other.base)  # the base does not read the control video
    assert (one.composed - other.composed).abs().max() > 1e-3  # the adapted prediction does


def test_the_encoder_has_the_declared_channels_and_pools_onto_the_block_grid():
    base = tiny_base()
    model = ComposedModel(base, video_controlnet(dim=3, encoder_downsample=1), Replace(), base.default_objective())
    assert model.adapter.embed.frames[0].in_channels == 3
    assert len([m for m in model.adapter.embed.frames if isinstance(m, torch.nn.Conv2d)]) == 2
    features = model.adapter.embed(torch.zeros(2, 3, 4, 16, 16), (4, 8, 8))
    assert features.shape == (2, 4, 8, 8, 16)


def test_a_video_controlnet_learns_to_read_its_control_video():
    """On the pretrained tiny_video and Meta-World clips, a control video that shows the frames to predict (the
    strongest control there is) is read after 100 steps: with each clip's own control the validation loss is far
    below that with another clip's control, at the same noise. The branch carries the control to the positions
    it covers."""
    from workbench.backbones.tiny_video import TinyVideo
    from workbench.data.metaworld import MetaWorldClips

    class Shown(torch.utils.data.Dataset):  # each clip with itself as its control video
        def __init__(self, split, stride):
            self.clips = MetaWorldClips(path="sample", window=4, stride=stride, split=split)

        def __len__(self):
            return len(self.clips)

        def __getitem__(self, i):
            item = self.clips[i]
            return {"video": item["video"], "control": item["video"].clone()}

    exp = AdapterExperiment(base=TinyVideo.from_pretrained(), adapter=video_controlnet(dim=3),
                            training=TrainingConfig(steps=100, learning_rate=5e-3, batch_size=4, progress=False))
    exp.fit(Shown("train", 4))
    model = exp.model.train(False)
    val = Shown("val", 8)
    items = [val[i] for i in range(0, 72, 6)]
    raw = {k: torch.stack([d[k] for d in items]) for k in ("video", "control")}

    def loss(r):
        batch = model.base.prepare_batch(r)
        total = torch.zeros(2)
        for seed in range(4):
            x_t, t, target = model.noised(batch, torch.Generator().manual_seed(seed))
            with torch.no_grad():
                p = model.predict(x_t, t, batch)
            total += torch.stack([(p.composed - target)[:, :, 1:].pow(2).mean(),
                                  (p.base - target)[:, :, 1:].pow(2).mean()])
        return total / 4

    (own, base), (other, _) = loss(raw), loss({**raw, "control": raw["control"].roll(1, dims=0)})
    assert own < 0.85 * base and own < 0.85 * other, (own, other, base)


def test_forks_swap_the_control_video_and_sliders_say_they_edit_vectors_only():
    from workbench.errors import InspectError
    from workbench.inspect.probes.ablation import ConditionEdit, swap_conditions
    from workbench.inspect.recording.trajectory import record

    base = tiny_base()
    model = ComposedModel(base, video_controlnet(), Replace(), base.default_objective()).train(False)
    perturb(model)
    batch = base.prepare_batch(with_control(raw_batch()))
    traj = record(model, batch, steps=3, seed=0)
    assert torch.equal(traj.fork(at=1).final, traj.final)
    swapped = traj.fork(at=1, cond=swap_conditions(traj, "control"))
    assert torch.equal(swapped[0].x_t, traj[0].x_t) and not torch.equal(swapped.final, traj.final)
    with pytest.raises(InspectError, match=r"ConditionEdit edits vector conditions, \(B, D\) or per frame \(B, T, D\); "
                                           r"'control' has shape \(2, 1, 4, 16, 16\)"):
        ConditionEdit(model, batch, "control")


# -- what reaches the adapter, and refusals --------------------------------------------------
def test_the_backbone_passes_the_control_video_as_it_is():
    raw = with_control(raw_batch(), channels=2)
    batch = tiny_base().prepare_batch(raw)
    assert torch.equal(batch.cond["control"], raw["control"]) and "control" not in batch.per_frame
    assert "control" in tiny_base().provides()


def test_generation_takes_its_length_from_the_control_video():
    g = torch.Generator().manual_seed(0)
    raw = {"image": torch.rand(1, 3, 16, 16, generator=g) * 2 - 1, "control": torch.zeros(1, 1, 6, 16, 16)}
    assert tiny_base().prepare_batch(raw).latents.shape[2] == 6


@pytest.mark.parametrize("control, match", [
    (torch.zeros(2, 4, 16, 16), r"tiny_video: 'control' must be a float control video \(B, C, T, H, W\) .*got "
                                r"\(2, 4, 16, 16\) torch\.float32\. .* add the channel axis with control\[:, None\]"),
    (torch.zeros(2, 1, 3, 16, 16), r"tiny_video: 'control' must cover the clip: \(B=2, C, T=4, H, W\), got "
                                   r"\(2, 1, 3, 16, 16\)\. Give one control frame per video frame\."),
    (torch.zeros(2, 1, 4, 16, 16, dtype=torch.uint8), r"must be a float control video"),
])
def test_a_control_video_of_the_wrong_shape_is_refused_by_the_backbone(control, match):
    with pytest.raises(DataError, match=match):
        tiny_base().prepare_batch({**raw_batch(), "control": control})


def test_a_control_video_with_other_channels_than_declared_is_refused_with_the_fix():
    base = tiny_base()
    model = ComposedModel(base, video_controlnet(dim=3), Replace(), base.default_objective())
    batch = base.prepare_batch(with_control(raw_batch(), channels=1))
    with pytest.raises(ConditionError, match=r"condition 'control' \(key 'control'\) is declared a video \(2, C=3, T, "
                                             r"H, W\), got shape \(2, 1, 4, 16, 16\)\. .* or declare dim=1\."):
        model.predict(*model.noised(batch, torch.Generator().manual_seed(0))[:2], batch)


def test_a_missing_control_video_is_refused_by_name():
    base = tiny_base()
    model = ComposedModel(base, video_controlnet(), Replace(), base.default_objective())
    batch = base.prepare_batch(raw_batch())
    with pytest.raises(ConditionError, match=r"consumes condition 'control' \(backbone key 'control'\); the backbone "
                                             r"declares it in provides\(\), but this batch has no 'control'"):
        model.predict(*model.noised(batch, torch.Generator().manual_seed(0))[:2], batch)


def test_reading_a_video_as_a_vector_says_to_declare_it_a_video():
    base = tiny_base()
    model = ComposedModel(base, ControlNet(condition="control", aliases=(), dim=16), Replace(),
                          base.default_objective())
    batch = base.prepare_batch(with_control(raw_batch()))
    with pytest.raises(ConditionError, match=r"is a video, shape \(2, 1, 4, 16, 16\) \(B, C, T, H, W\), but the "
                                             r"Condition reads a per-frame vector of width 16\. Declare "
                                             r"Condition\('control', video=True, dim=1\)"):
        model.predict(*model.noised(batch, torch.Generator().manual_seed(0))[:2], batch)


def test_a_video_condition_keeps_its_frames():
    with pytest.raises(ConditionError, match=r"Condition 'depth': video=True with per_frame='keep'; .* leave "
                                             r"per_frame=None"):
        Condition("depth", video=True, per_frame="keep")


@pytest.mark.parametrize("config, match", [
    ({"encoder_width": 0}, r"adapter\.config\.encoder_width: must be >= 1, got 0"),
    ({"encoder_downsample": 7}, r"adapter\.config\.encoder_downsample: must be in 0\.\.6 .*got 7"),
])
def test_bad_encoder_settings_are_refused(config, match):
    with pytest.raises(ConfigError, match=match):
        build("adapter", "controlnet", {"video": True, "condition": "control", "dim": 1, **config})


def test_tokens_that_are_not_a_patch_grid_are_refused():
    assert block_grid(torch.zeros(1, 3 * 4 * 8, 5), "tokens", (1, 4, 3, 8, 16)) == (3, 4, 8)
    with pytest.raises(CompositionError, match=r"a block's 50 tokens are not a 3-frame grid of the 8x16 latents"):
        block_grid(torch.zeros(1, 50, 5), "tokens", (1, 4, 3, 8, 16))


# -- edges -----------------------------------------------------------------------------------
def test_edges_are_minus_one_on_flat_regions_and_one_on_a_full_step():
    video = -torch.ones(3, 2, 8, 8)
    video[:, 1, :, 4:] = 1.0  # frame 1: black left half, white right half
    e = edges(video)
    assert e.shape == (1, 2, 8, 8)
    assert torch.equal(e[0, 0], -torch.ones(8, 8))  # a flat frame has no edge
    assert torch.equal(e[0, 1, :, 3:5], torch.ones(8, 2)) and torch.equal(e[0, 1, :, :3], -torch.ones(8, 3))


def test_edges_refuse_a_frames_last_clip():
    with pytest.raises(DataError, match=r"edges expects a float clip \(3, T, H, W\) in \[-1, 1\], got \(2, 8, 8, 3\)"):
        edges(torch.zeros(2, 8, 8, 3))


def test_metaworld_clips_carry_their_edges_when_asked():
    from workbench.data.metaworld import MetaWorldClips

    plain = MetaWorldClips(path="sample", window=4, split="val")[0]
    item = MetaWorldClips(path="sample", window=4, split="val", control="edges")[0]
    assert "control" not in plain and torch.equal(item["control"], edges(item["video"]))
    assert item["control"].shape == (1, 4, *item["video"].shape[-2:]) and item["control"].max() > 0
    with pytest.raises(ConfigError, match=r"control: must be null \(no control video\) or one of \['edges'\], got "
                                          r"'depth'"):
        MetaWorldClips(path="sample", control="depth")


# -- the diffusers layouts -------------------------------------------------------------------
@requires_plugins
def test_a_video_controlnet_keeps_its_promises_on_the_tiny_wan(tmp_path_factory):
    """Wan's blocks hold tokens (frame-major patches): the control video is pooled onto the patch grid of the causal
    VAE's latent frames (9 pixel frames -> 3 latent frames)."""
    import workbench_wan22.tiny

    folder = workbench_wan22.tiny.save_tiny_pipeline(tmp_path_factory.mktemp("wan") / "tiny")

    def load():
        return build("backbone", "wan22_ti2v", {"path": str(folder), "height": 64, "width": 64, "num_frames": 9,
                                                "steps": 4, "prompt": "a robot arm"})

    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(2, 3, 9, 64, 64, generator=g) * 2 - 1, "prompt": "a robot arm",
           "control": torch.rand(2, 1, 9, 64, 64, generator=g) * 2 - 1}
    report = check_inside_adapter(load, video_controlnet, raw=raw, steps=2)
    assert report.ok and report["recording"].detail == "2 steps, 4 base calls per step recorded (2 sampling), bit-exact"
    with pytest.raises(DataError, match=r"wan22_ti2v: 'control' must cover the clip: \(B=2, C, T=9, H, W\)"):
        load().prepare_batch({**raw, "control": raw["control"][:, :, :5]})
