"""The conformance kit itself: it passes good backbones and reports each broken promise, all at once.

One small, correct toy backbone (first frame given, Euler sampler) and, per promise, a variant
that breaks exactly that promise the way a plugin author might.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY
from torch import nn

from workbench import Adapter, BaseVideoModel, Batch, ComponentSpec, Diffusion, FlowMatching, ModelCard, StepRecord
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.core.capabilities import (
    CachesLatents,
    GivenFrames,
    InsideAccess,
    KeepsFloat32,
    LatentLayout,
    Previews,
    SamplingOptions,
)
from workbench.core.card import SamplingDefaults
from workbench.core.inside import InsideSpec
from workbench.errors import ConformanceError, WorkbenchError
from workbench.testing import CAPABILITY_PROMISES, PROMISES, ProbeAdapter, check_backbone

REQUIRED_PROMISES = [p for p in PROMISES if p not in CAPABILITY_PROMISES]


class Toy(BaseVideoModel, GivenFrames):
    """A correct backbone: 2x2 patch autoencoder, a 1x1 conv denoiser, frame 0 given (and kept by constrain)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Conv3d(3, 4, (1, 2, 2), stride=(1, 2, 2))
        self.dec = nn.ConvTranspose3d(4, 3, (1, 2, 2), stride=(1, 2, 2))
        self.net = nn.Conv3d(4, 4, 1)
        self.register_buffer("scale", torch.ones(4))
        self.card = ModelCard(model_id="toy", family="toy", prediction_type="velocity",
                              components={"denoiser": ComponentSpec("denoiser", "random"),
                                          "vae": ComponentSpec("vae", "random")},
                              sampling=SamplingDefaults(steps=4, num_frames=3, height=4, width=4),
                              capabilities=("i2v",))

    def provides(self):
        return ("first_frame", "action")

    def default_objective(self):
        return FlowMatching()

    def encode(self, video):
        return self.enc(video.to(self.dtype)) * self.scale.view(1, -1, 1, 1, 1)

    def decode(self, latents):
        return torch.tanh(self.dec(latents.to(self.dtype)))

    def prepare_batch(self, raw):
        if isinstance(raw, Batch):
            return raw
        video = raw.get("video")
        if video is None:  # a generation request: the first frame, as many frames as the actions
            image = torch.as_tensor(raw["image"])
            video = image[:, :, None].expand(-1, -1, torch.as_tensor(raw["action"]).shape[1], -1, -1)
        with torch.no_grad():
            latents = self.encode(torch.as_tensor(video).to(self.device))
        return self.batch_of(latents, raw["action"])

    def batch_of(self, latents, action):
        cond = {"first_frame": latents[:, :, 0], "action": torch.as_tensor(action).to(self.device)}
        mask = torch.ones(latents.shape[0], latents.shape[2], device=self.device)
        mask[:, 0] = 0
        return Batch(latents=latents, cond=cond, loss_mask=mask, per_frame=frozenset({"action"}))

    def pinned(self, pred, x_t, t, cond):
        out = pred.clone()
        out[:, :, 0] = (x_t[:, :, 0] - cond["first_frame"]) / t.to(x_t.dtype).clamp_min(1e-4).view(-1, 1, 1, 1)
        return out

    def denoise(self, x_t, t, cond):
        return self.pinned(self.net(x_t) * (1 + t.to(x_t.dtype).view(-1, 1, 1, 1, 1)), x_t, t, cond)

    def constrain(self, prediction, x_t, t, cond):
        return self.pinned(prediction, x_t, t, cond)

    def noise(self, batch, generator):
        return torch.randn(batch.latents.shape, generator=generator, device=batch.latents.device,
                           dtype=batch.latents.dtype)

    def run_sampler(self, batch, *, steps, sampler, generator, compose_fn, on_step, **kwargs):
        x = self.noise(batch, generator)
        times = torch.linspace(1, 0, steps + 1, device=x.device)
        for i in range(steps):
            t = times[i].expand(x.shape[0])
            pred = self.predict(x, t, batch, compose_fn)
            x_next = x + (times[i + 1] - times[i]).to(x.dtype) * pred
            if on_step is not None:
                on_step(StepRecord(i, steps, t, x, pred, x_next))
            x = x_next
        x = x.clone()
        x[:, :, 0] = batch.cond["first_frame"]
        return x

    def predict(self, x, t, batch, compose_fn):
        return compose_fn(x, t, batch)


def toy_raw(b: int = 2, t: int = 3) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"video": torch.rand(b, 3, t, 4, 4, generator=g) * 2 - 1, "action": torch.rand(b, t, 4, generator=g)}


# -- one broken promise each ---------------------------------------------------------------
class WrongObjective(Toy):
    def default_objective(self):
        return Diffusion(prediction="eps")


class PinsAFloat32Buffer(Toy):
    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.scale = self.scale.float()  # "the scale must stay in float32": it then never moves with .to(dtype)
        return out


class MisnamedCondition(Toy):
    def provides(self):
        return ("first_frame", "actions")


class DecodeLosesAFrame(Toy):
    def decode(self, latents):
        return super().decode(latents)[:, :, 1:]


class UnpinnedDenoise(Toy):
    def denoise(self, x_t, t, cond):
        return self.net(x_t) * (1 + t.to(x_t.dtype).view(-1, 1, 1, 1, 1))


class ConstrainTouchesPredictedFrames(Toy):
    def pinned(self, pred, x_t, t, cond):
        out = super().pinned(pred, x_t, t, cond)
        out[:, :, -1] = 0
        return out


class GlobalNoise(Toy):
    def noise(self, batch, generator):
        return torch.randn(batch.latents.shape, dtype=batch.latents.dtype)  # ignores the generator


class GuidanceAroundComposeFn(Toy):
    def predict(self, x, t, batch, compose_fn):
        uncond = self.denoise(x, t, {**batch.cond, "action": torch.zeros_like(batch.cond["action"])})
        return uncond + 1.5 * (compose_fn(x, t, batch) - uncond)


class GuidesWithoutSayingSo(Toy):
    def predict(self, x, t, batch, compose_fn):
        cond = compose_fn(x, t, batch)
        zeroed = {**batch.cond, "action": torch.zeros_like(batch.cond["action"])}
        unconditional = Batch(latents=batch.latents, cond=zeroed, loss_mask=batch.loss_mask)
        uncond = compose_fn(x, t, unconditional)  # a second call a step; predictions_per_step still says 1
        return uncond + 1.5 * (cond - uncond)


class MiscountsItsLatentFrames(Toy, LatentLayout):
    def latent_frames(self, frames):
        return frames // 2  # "the autoencoder halves time": it does not


class ContinuesFromTheRecordedClip(Toy, SamplingOptions):
    """Generates from a frame of its own making, not the video it is given: a rollout cannot continue through it."""

    def generation_inputs(self, video):
        return {"image": torch.zeros_like(video[:, :, 0])}


class SaysItDecodesFramesAlone(Toy, LatentLayout):
    decodes_frames_alone = True  # "a per-frame decoder": each frame sees the others

    def decode(self, latents):
        video = super().decode(latents)
        return (video + 0.5 * video.mean(dim=2, keepdim=True)).clamp(-1, 1)


class CannotContinue(Toy):
    """Says it has no frame to continue from (an interpolation mode would): rollouts refuse it, and the kit says so."""

    def __init__(self):
        super().__init__()
        self.card = dataclasses.replace(self.card, context_frames=0)


class CountsItsCalls(Toy):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def denoise(self, x_t, t, cond):
        self.calls += 1
        return super().denoise(x_t, t, cond)


# -- capabilities: declared and kept, declared and broken ---------------------------------------
class CachesItsLatents(Toy, CachesLatents):
    """A latent cache: ``encode_item`` turns a clip's video into its latents, which ``prepare_batch`` accepts."""

    def encode(self, video):  # clip by clip: a clip's latents never depend on the batch it came in
        return torch.cat([super(CachesItsLatents, self).encode(clip[None]) for clip in video])

    def encode_item(self, item):
        with torch.no_grad():
            latents = self.encode(torch.as_tensor(item["video"])[None].to(self.device))[0]
        return {**{k: v for k, v in item.items() if k != "video"}, "latents": self.stored(latents).cpu()}

    def stored(self, latents):
        return latents

    def prepare_batch(self, raw):
        if isinstance(raw, Batch) or "latents" not in raw:
            return super().prepare_batch(raw)
        return self.batch_of(torch.as_tensor(raw["latents"]).to(self.device), raw["action"])


class CachesInHalfPrecision(CachesItsLatents):
    def stored(self, latents):
        return latents.half().float()  # "half the disk": the cached batch is no longer the raw one


class PreviewsAStrayDecoder(Toy, Previews):
    def preview_decoder(self):
        return nn.ConvTranspose3d(4, 3, (1, 2, 2), stride=(1, 2, 2))  # a new module, not the one decode runs


class MisnamesItsInside(Toy, InsideAccess):
    def inside_spec(self):
        return InsideSpec(root=self.net, root_name="denoiser", lora_targets=("net",), blocks=(self.net,), widths=(4,),
                          branch_blocks=0, layout="channels")


class DeclaresACacheItDoesNotWrite(Toy, CachesLatents):
    pass


class KeepsTheBase(ProbeAdapter):
    def attach_base_model(self, base):
        self.base = base  # registered as a submodule: the base's weights land in the checkpoint


BROKEN = [
    pytest.param(WrongObjective, {}, "card", r"default_objective\(\) trains a 'eps' prediction but the card says "
                 r"'velocity'; make them agree", id="card"),
    pytest.param(PinsAFloat32Buffer, {"dtype": torch.float64}, "to", r"left scale not torch.float64", id="to"),
    pytest.param(MisnamedCondition, {}, "provides", r"cond has \['action'\] that provides\(\) does not name .*"
                 r"provides\(\) names \['actions'\] but prepare_batch\(raw\) did not supply them", id="provides"),
    pytest.param(DecodeLosesAFrame, {}, "encode_decode", r"decode\(encode\(video\)\) must be floating video of the "
                 r"input's shape \(2, 3, 3, 4, 4\), got \(2, 3, 2, 4, 4\)", id="encode_decode"),
    pytest.param(UnpinnedDenoise, {}, "identity",
                 r"Add with a zero adapter is not the frozen base bit for bit: max \|difference\| 2\.",
                 id="identity"),
    pytest.param(ConstrainTouchesPredictedFrames, {}, "given_frames", r"constrain changed frames the model predicts",
                 id="given_frames"),
    pytest.param(GlobalNoise, {}, "recording", r"generate\(\) drew from torch's global random generator",
                 id="recording"),
    pytest.param(GuidanceAroundComposeFn, {}, "fork", r"a fork at step 2 of 4 made 6 base calls, expected 4 \(2 per "
                 r"live step\): the prefix must be replayed, not run", id="fork"),
    pytest.param(GuidesWithoutSayingSo, {}, "recording", r"the sampler called compose_fn 2 time\(s\) in a step, but "
                 r"predictions_per_step\(batch, \*\*sampler_kwargs\) says 1: a recording keeps every call's "
                 r"prediction, so estimate_memory", id="recording-calls"),
    pytest.param(MiscountsItsLatentFrames, {}, "clip", r"clip\(\) says 3 frames make 1 latent frames, encode\(\) "
                 r"makes 3: latent_frames\(\) must follow the autoencoder", id="clip"),
    pytest.param(ContinuesFromTheRecordedClip, {}, "rollout", r"chunk 1 was not generated from the last frame chunk 0 "
                 r"produced: its request's 'image' differs", id="rollout"),
    pytest.param(SaysItDecodesFramesAlone, {}, "rollout", r"produced: its request's 'image' differs .*it declares "
                 r"decodes_frames_alone, so the frame was decoded alone: decode must give each frame the same values "
                 r"whatever frames it decodes with", id="rollout-decodes-alone"),
    pytest.param(CountsItsCalls, {}, "training", r"training changed the frozen base: calls", id="training"),
    pytest.param(Toy, {"adapter_factory": KeepsTheBase}, "state_dict", r"base weights saved as adapter\.base\.",
                 id="state_dict"),
]


def test_a_correct_backbone_keeps_every_promise():
    report = check_backbone(Toy, raw=toy_raw())
    assert report.ok and [f.promise for f in report.findings] == REQUIRED_PROMISES and len(REQUIRED_PROMISES) == 12
    assert all(f.status == "kept" for f in report.findings)
    assert str(report).startswith("Toy (toy) on cpu: all 12 promises kept; declares GivenFrames\n")
    assert report.declared == ("GivenFrames",)
    assert "fork at 2: prefix bit-exact, 2 base calls" in report["fork"].detail
    assert report["clip"].detail == ("3 frames of 4x4 -> 3 latent frames; 2 clips predicted three ways (base, adapter, "
                                     "swapped conditions) at that size, the base's bit-exact")


@pytest.mark.parametrize(("toy", "options", "promise", "match"), BROKEN)
def test_each_broken_promise_is_reported_with_what_was_found(toy, options, promise, match):
    with pytest.raises(ConformanceError) as err:
        check_backbone(toy, raw=toy_raw(), **options)
    report = err.value.report
    finding = report[promise]
    assert finding.status == "broken", str(report)
    assert re.search(match, finding.detail), finding.detail
    assert f"FAIL {promise}: {PROMISES[promise][0]}" in str(err.value)
    assert isinstance(err.value, WorkbenchError) and isinstance(err.value, AssertionError)


def test_a_backbone_with_only_the_required_part_keeps_every_promise_and_declares_nothing():
    """The guide's worked example (the fixture plugin's backbone): no capability, every required promise kept."""
    import importlib.util

    path = Path(__file__).parent / "fixtures" / "workbench-fixture-plugin" / "workbench_fixture_plugin" / "backbone.py"
    spec = importlib.util.spec_from_file_location("fixture_backbone", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = check_backbone(module.FixtureVideo)  # with its own example_batch()
    assert report.ok and report.declared == () and [f.promise for f in report.findings] == REQUIRED_PROMISES
    assert str(report).startswith("FixtureVideo (fixture-video) on cpu: all 12 promises kept; "
                                  "declares no optional capability\n")
    assert [f.promise for f in report.findings if f.status != "kept"] == ["rollout"]  # text-to-video: no image


def test_a_declared_capability_is_found_and_checked():
    report = check_backbone(CachesItsLatents, raw=toy_raw(), promises=["latent_cache"])
    assert report.declared == ("GivenFrames", "CachesLatents") and report["latent_cache"].status == "kept"
    assert report["latent_cache"].detail == ("2 items cached as ['action', 'latents']; prepare_batch of them is the "
                                             "raw items', bit-exact")
    assert "all 1 promises kept; declares GivenFrames, CachesLatents" in str(report)


@pytest.mark.parametrize(("toy", "promise", "match"), [
    pytest.param(CachesInHalfPrecision, "latent_cache", r"^prepare_batch of the collated cached items differs from "
                 r"prepare_batch of the collated raw items in latents \(max \|difference\| [0-9.e-]+\); "
                 r"cond\['first_frame'\] \(max \|difference\| [0-9.e-]+\)\. A cache must change nothing: run "
                 r"the frozen encoders clip by clip in prepare_batch too", id="latent_cache"),
    pytest.param(PreviewsAStrayDecoder, "previews", r"^preview_decoder\(\) returned ConvTranspose3d; it must be the "
                 r"submodule decode\(\) runs, or None\.$", id="previews"),
    pytest.param(MisnamesItsInside, "inside", r"^inside_spec\(\)\.root_name is 'denoiser', but the root is the "
                 r"backbone's 'net': exported LoRA keys are prefixed with root_name\.$", id="inside"),
])
def test_a_declared_capability_that_breaks_its_promise_is_reported_broken(toy, promise, match):
    with pytest.raises(ConformanceError) as err:
        check_backbone(toy, raw=toy_raw(), promises=[promise])
    finding = err.value.report[promise]
    assert finding.status == "broken" and re.search(match, finding.detail), finding.detail
    assert f"FAIL {promise}: {PROMISES[promise][0]}" in str(err.value)


def test_a_declared_capability_left_unwritten_or_a_member_set_without_its_capability_is_refused_first():
    with pytest.raises(ConformanceError) as err:
        check_backbone(DeclaresACacheItDoesNotWrite, raw=toy_raw())
    assert ("FAIL capabilities: writes the members of the capabilities it declares, and declares those it writes\n"
            "         DeclaresACacheItDoesNotWrite declares CachesLatents but leaves encode_item as its stub. Write "
            "each member (its docstring in workbench.core.capabilities says what it promises) and list each "
            "capability among the bases.") in str(err.value)
    toy = Toy()
    toy.max_generate_batch = 1  # "one clip at a time": nothing reads it off a backbone without SamplingOptions
    with pytest.raises(ConformanceError, match=r"Toy sets max_generate_batch of SamplingOptions without declaring "
                                               r"SamplingOptions, so workbench never uses it\."):
        check_backbone(toy, raw=toy_raw())


def test_a_capabilitys_promise_asked_of_a_backbone_without_it_is_skipped_saying_so():
    report = check_backbone(Toy, raw=toy_raw(), promises=["latent_cache", "inside"])
    assert [(f.status, f.detail) for f in report.findings] == [
        ("skipped", "Toy does not declare CachesLatents."), ("skipped", "Toy does not declare InsideAccess.")]


def test_a_backbone_without_a_frame_to_continue_from_is_skipped_with_the_refusal():
    report = check_backbone(CannotContinue, raw=toy_raw())
    assert report.ok and report["rollout"].status == "skipped"
    assert re.search(r"card.context_frames=0: no frame to continue from, and rollout refuses so: 'toy' \(mode 'i2v'\) "
                     r"cannot be rolled out: its card says context_frames=0", report["rollout"].detail)
    assert report["rollout"].detail.endswith("Use an image-to-video mode of the backbone.")


def test_one_report_lists_every_broken_promise_and_what_could_not_be_checked():
    class TwoBugs(GlobalNoise, UnpinnedDenoise):
        pass

    report = check_backbone(TwoBugs, raw=toy_raw(), raise_on_broken=False)
    assert {f.promise for f in report.findings if f.status == "broken"} >= {"identity", "recording"}
    assert report["fork"].status == "not checked"
    assert "needs recording, which an earlier promise did not produce" in report["fork"].detail
    assert str(report).startswith("TwoBugs (toy) on cpu: ")


def test_a_failing_prepare_batch_blocks_what_needs_a_batch_and_says_why():
    report = check_backbone(Toy, raw={"video": torch.zeros(2, 3, 3, 4, 4)}, raise_on_broken=False)
    assert report["provides"].detail == "raised KeyError: 'action'"
    assert report["identity"].status == "not checked"
    assert report["identity"].detail == "prepare_batch(raw) failed: KeyError: 'action'"
    assert report["card"].status == "kept"


def test_the_kit_refuses_what_is_not_a_backbone_and_unknown_promises():
    with pytest.raises(ConformanceError, match=r"make_backbone\(\) returns a workbench BaseVideoModel\n.*got Linear"):
        check_backbone(lambda: nn.Linear(2, 2), raw={})
    with pytest.raises(ValueError, match=r"Unknown promise 'recordng'; the promises are .*Did you mean 'recording'"):
        check_backbone(Toy, raw=toy_raw(), promises=["recordng"])


def test_sampling_checks_take_their_own_request():
    report = check_backbone(Toy, raw=toy_raw(), generate_raw=toy_raw(b=1, t=5), steps=6, fork_at=4,
                            promises=["recording", "fork"])
    assert [f.promise for f in report.findings] == ["recording", "fork"]
    assert report["fork"].detail == "fork at 4: prefix bit-exact, 2 base calls"


def test_a_nonzero_adapter_is_refused_for_the_identity_promise():
    class Nonzero(ProbeAdapter):
        def __init__(self):
            super().__init__()
            nn.init.constant_(self.scale, 0.5)

    with pytest.raises(ConformanceError, match=r"the adapter from adapter_factory is not zero at init"):
        check_backbone(Toy, raw=toy_raw(), adapter_factory=Nonzero, promises=["identity"])


def test_the_kit_leaves_a_counted_denoise_in_place():
    base = Toy()
    seen = []
    inner = base.denoise
    base.denoise = lambda *a: seen.append(1) or inner(*a)
    check_backbone(base, raw=toy_raw(), promises=["recording", "fork"])
    assert "denoise" in vars(base) and seen  # the instance's own wrapper is back after counting


def test_every_backbone_attribute_read_anywhere_is_declared_on_the_base_class_or_a_capability():
    """What workbench reads off a backbone by name (``getattr(base, "...")``) is declared on BaseVideoModel or
    on a capability; a capability's data members have their one default there."""
    from workbench.core.capabilities import CAPABILITIES, DECODER_MODULES

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"getattr\((?:self\.)?(?:base|model\.base|traj\.model\.base|self\.base), \"(\w+)\"")
    read = {m.group(1) for path in (root / "workbench").rglob("*.py") for m in pattern.finditer(path.read_text())}
    defaults = {name: getattr(capability, name) for capability in CAPABILITIES for name in vars(capability)
                if not name.startswith("_") and not callable(getattr(capability, name))}
    assert defaults == {"max_generate_batch": None, "sampler_inputs": (), "causal_latents": None,
                        "decodes_frames_alone": False, "pixel_space": None}
    from workbench.backbones.diffusers_bridge import DiffusersBackbone

    # what only a diffusers pipeline has (its pipelines, its cached call's version) the bridge declares
    bridge = {n for n in read if not hasattr(BaseVideoModel, n) and hasattr(DiffusersBackbone, n)}
    assert bridge == {"forward_version", "pipelines"}
    undeclared = sorted(n for n in read - bridge
                        if not hasattr(BaseVideoModel, n) and not any(hasattr(c, n) for c in CAPABILITIES))
    assert undeclared == [], f"declare these on BaseVideoModel or a capability, with a docstring: {undeclared}"
    assert set(DECODER_MODULES) == {"vae", "autoencoder", "first_stage_model", "decoder"}
    assert not any(hasattr(BaseVideoModel, n) for n in DECODER_MODULES)


def test_a_backbone_writing_a_capabilitys_member_without_declaring_it_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match=r"^Cached writes encode_item of the CachesLatents capability without declaring "
                                        r"it, so workbench would never use it\. Add CachesLatents to its bases \(from "
                                        r"workbench\.core\.capabilities import CachesLatents\)\.$"):
        class Cached(Toy):
            def encode_item(self, item):
                return item


def test_the_base_class_is_the_required_part_and_the_capabilities_are_on_the_side():
    """Every optional member lives on one capability; the base class holds none of them."""
    from workbench.core.capabilities import CAPABILITIES, members, must_write

    names = [m for c in CAPABILITIES for m in members(c)]
    assert len(names) == len(set(names)) and not any(hasattr(BaseVideoModel, n) for n in names)
    assert {c.__name__: must_write(c) for c in CAPABILITIES if must_write(c)} == {
        "GivenFrames": ("constrain",), "CachesLatents": ("encode_item",), "InsideAccess": ("inside_spec",),
        "Compilable": ("compile_target",), "MemoryPlanning": ("planning_inputs",),
        "KeepsFloat32": ("keep_in_float32",), "TrainingCallbacks": ("callbacks",)}
    for capability in CAPABILITIES:  # a member without a default says, when called, what to write
        for name in must_write(capability):
            with pytest.raises(NotImplementedError, match=rf"Toy declares {capability.__name__} but does not write "
                                                          rf"{name}: define {name}\("):
                getattr(capability, name)(Toy(), *([None] * (getattr(capability, name).__code__.co_argcount - 1)))


# -- the embedded backbone -----------------------------------------------------------------
def tiny_raw(b: int = 2, t: int = 4, size: int = 16) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"video": torch.rand(b, 3, t, size, size, generator=g) * 2 - 1,
            **{k: torch.rand(b, t, d, generator=g) * 2 - 1 for k, d in (("action", 4), ("proprio", 3), ("ee_pos", 3))},
            "control": torch.rand(b, 1, t, size, size, generator=g) * 2 - 1,
            "camera": torch.rand(b, 12, generator=g)}  # the per-clip calibration (a 3x4 projection)


def make_tiny(**overrides):
    def make():
        torch.manual_seed(0)
        return TinyVideo(TinyVideoConfig(**{**TINY, **overrides}))
    return make


@pytest.mark.parametrize("objective", ["flow_matching", "diffusion"])
@pytest.mark.parametrize("adapter", ["probe", "latent_residual"])
def test_tiny_video_keeps_the_contract(objective, adapter):
    factory = (lambda: LatentResidual(width=16, depth=1)) if adapter == "latent_residual" else None
    report = check_backbone(make_tiny(objective=objective), raw=tiny_raw(), adapter_factory=factory)
    assert report.ok and "given latent frames [0] kept" in report["given_frames"].detail
    assert report.declared == ("GivenFrames", "LatentLayout", "CachesLatents", "InsideAccess", "MemoryPlanning")
    assert [f.promise for f in report.findings] == [*REQUIRED_PROMISES, "latent_cache", "inside", "memory_plan"]


@pytest.mark.parametrize("objective", ["flow_matching", "diffusion"])
def test_tiny_video_keeps_the_contract_in_bfloat16(objective):
    report = check_backbone(make_tiny(objective=objective), raw=tiny_raw(), dtype=torch.bfloat16,
                            adapter_factory=lambda: LatentResidual(width=16, depth=1))
    assert report.setting == "cpu bfloat16"
    assert "torch.bfloat16 -> video torch.bfloat16" in report["encode_decode"].detail


def test_importing_the_kit_loads_neither_pytest_nor_heavy_libraries():
    code = ("import sys, json; from workbench.testing import check_backbone; "
            "print(json.dumps(sorted(m for m in ('pytest', 'diffusers', 'transformers', 'matplotlib', 'ipywidgets', "
            "'h5py') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_adapters_the_kit_accepts_are_workbench_adapters():
    with pytest.raises(ConformanceError, match=r"adapter_factory\(\) returned Linear, not a workbench Adapter"):
        check_backbone(Toy, raw=toy_raw(), adapter_factory=lambda: nn.Linear(2, 2), promises=["identity"])
    assert issubclass(ProbeAdapter, Adapter)


def test_what_a_backbone_keeps_in_float32_stays_so_and_the_kit_checks_it():
    """``keep_in_float32()`` (diffusers' ``_keep_in_fp32_modules``, for any backbone): ``.to(bf16)`` moves those
    tensors to the device, not to the dtype; ``base.dtype`` is the dtype the rest computes in."""
    from conftest import ToyBackbone

    class Kept(ToyBackbone, KeepsFloat32):
        def keep_in_float32(self):
            return ("net.1", "net.3.bias")  # a module (the batch norm) and a single parameter

    toy = Kept()
    before = {k: v.clone() for k, v in toy.state_dict().items()}
    toy.to(torch.bfloat16)
    dtypes = {k: v.dtype for k, v in toy.state_dict().items() if v.is_floating_point()}
    assert dtypes == {"net.0.weight": torch.bfloat16, "net.0.bias": torch.bfloat16, "net.1.weight": torch.float32,
                      "net.1.bias": torch.float32, "net.1.running_mean": torch.float32,
                      "net.1.running_var": torch.float32, "net.3.weight": torch.bfloat16, "net.3.bias": torch.float32}
    assert toy.dtype == torch.bfloat16 and torch.equal(toy.net[1].weight, before["net.1.weight"])
    toy.to(torch.float64)
    assert toy.net[0].weight.dtype == torch.float64 and toy.net[1].weight.dtype == torch.float32
    report = check_backbone(Kept(), raw={"latents": torch.randn(2, 4, 3, 4, 4), "action": torch.randn(2, 3, 2)},
                            dtype=torch.bfloat16, promises=["to"])
    assert report["to"].detail == "9 tensors on cpu; 5 kept in float32, round trip bit-exact"


def test_a_backbone_that_leaves_required_methods_unimplemented_is_told_which_before_any_promise():
    class Half(Toy):
        denoise = BaseVideoModel.denoise
        run_sampler = BaseVideoModel.run_sampler

    from workbench.core.backbone import REQUIRED_METHODS, unimplemented

    assert unimplemented(Half) == ("denoise", "run_sampler") and unimplemented(Toy()) == ()
    assert unimplemented(TinyVideo) == () and unimplemented(BaseVideoModel) == REQUIRED_METHODS
    with pytest.raises(ConformanceError) as err:
        check_backbone(Half, raw=toy_raw())
    assert ("FAIL backbone: implements every required method of the backbone contract\n         Half leaves 2 of the "
            "7 required methods as BaseVideoModel's stubs: denoise, run_sampler. Implement each: its docstring on "
            "workbench.BaseVideoModel says what it promises, and docs/guides/writing-a-backbone.md lists them under "
            "'The required part'.") in str(err.value)
