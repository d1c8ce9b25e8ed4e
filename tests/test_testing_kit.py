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
from workbench.core.card import SamplingDefaults
from workbench.errors import ConformanceError, WorkbenchError
from workbench.testing import PROMISES, ProbeAdapter, check_backbone


class Toy(BaseVideoModel):
    """A correct backbone: 2x2 patch autoencoder, a 1x1 conv denoiser, frame 0 given."""

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
        cond = {"first_frame": latents[:, :, 0], "action": torch.as_tensor(raw["action"]).to(self.device)}
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


class MiscountsItsLatentFrames(Toy):
    def latent_frames(self, frames):
        return frames // 2  # "the autoencoder halves time": it does not


class ContinuesFromTheRecordedClip(Toy):
    """Generates from a frame of its own making, not the video it is given: a rollout cannot continue through it."""

    def generation_inputs(self, video):
        return {"image": torch.zeros_like(video[:, :, 0])}


class SaysItDecodesFramesAlone(Toy):
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
    pytest.param(ConstrainTouchesPredictedFrames, {}, "constrain", r"constrain changed frames the model predicts",
                 id="constrain"),
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
    assert report.ok and [f.promise for f in report.findings] == list(PROMISES)
    assert all(f.status == "kept" for f in report.findings)
    assert str(report).startswith("Toy (toy) on cpu: all 12 promises kept")
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


def test_a_backbone_still_defining_the_old_sampler_hook_is_told_to_rename_it():
    with pytest.raises(TypeError, match=r"Old defines _generate: the sampler hook is called run_sampler now"):
        class Old(Toy):
            def _generate(self, batch, **kwargs):
                return batch.latents


def test_every_backbone_attribute_read_anywhere_is_declared_on_the_base_class():
    """What workbench reads off a backbone by name (``getattr(base, "...")``) has its one default on
    BaseVideoModel; the attributes the instruments read plainly are declared there with theirs."""
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"getattr\((?:self\.)?(?:base|model\.base|traj\.model\.base|self\.base), \"(\w+)\"")
    read = {m.group(1) for path in (root / "workbench").rglob("*.py") for m in pattern.finditer(path.read_text())}
    defaults = {name: getattr(BaseVideoModel, name) for name in ("causal_latents", "pixel_space", "preview_identity",
                                                                 "sampler_inputs")}
    assert defaults == {"causal_latents": None, "pixel_space": None, "preview_identity": None, "sampler_inputs": ()}
    from workbench.backbones.diffusers_bridge import DiffusersBackbone

    # what only a diffusers pipeline has (its pipelines, its cached call's version) the bridge declares
    bridge = {n for n in read if not hasattr(BaseVideoModel, n) and hasattr(DiffusersBackbone, n)}
    assert bridge == {"forward_version", "pipelines"}
    undeclared = sorted(n for n in read - bridge if not hasattr(BaseVideoModel, n))
    assert undeclared == [], f"declare these on BaseVideoModel (with a docstring and the default): {undeclared}"
    decoders = {"vae", "autoencoder", "first_stage_model", "decoder"}
    assert set(BaseVideoModel.decoder_modules) == decoders and not any(hasattr(BaseVideoModel, n) for n in decoders)


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
    assert report.ok and "given latent frames [0] kept" in report["constrain"].detail


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

    class Kept(ToyBackbone):
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
