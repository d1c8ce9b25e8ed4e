"""The promises of the backbone contract, one check each (see ``BaseVideoModel``), and
:func:`check_backbone`, which checks them all in one call and gives one report.

A check returns a short note (or nothing) when its promise holds, raises :class:`Broken`
saying what was found when it does not, and :class:`Skipped` when it cannot be checked with
what was given. Anything else the backbone raises is reported as broken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.core.adapter import Adapter
from workbench.core.backbone import (
    REQUIRED_METHODS,
    BaseVideoModel,
    as_video,
    causal_latents,
    decodes_frames_alone,
    float32_paths,
    lies_within,
    max_generate_batch,
    predictions_per_step,
    sampler_inputs,
    unimplemented,
)
from workbench.core.capabilities import (
    CachesLatents,
    Compilable,
    GivenFrames,
    InsideAccess,
    MemoryPlanning,
    Previews,
    TrainingCallbacks,
    declared,
    undeclared,
    unwritten,
)
from workbench.core.card import ClipSpec, ModelCard
from workbench.core.conditions import Batch
from workbench.errors import ConformanceError, did_you_mean, listing
from workbench.testing.kit import (
    Blocked,
    Broken,
    ConformanceReport,
    Finding,
    ProbeAdapter,
    Skipped,
    Subject,
    counting_base_calls,
    differing,
    few,
    max_diff,
    snapshot,
    tensors,
)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    """For values computed two legitimate ways (the pipeline's own encode vs ours): dtype-sized."""
    return ({"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.bfloat16, torch.float16)
            else {"rtol": 1e-4, "atol": 1e-4})


# -- the card and placement ----------------------------------------------------------------
def check_card(s: Subject) -> str:
    base = s.base
    if not isinstance(base.card, ModelCard):
        raise Broken(f"base.card is {base.card!r}; set `self.card = ModelCard(...)` in __init__.")
    problems = base.card.problems()
    if problems:
        raise Broken("; ".join(problems))
    objective = base.default_objective()
    if objective.prediction_type != base.card.prediction_type:
        raise Broken(f"default_objective() trains a {objective.prediction_type!r} prediction "
                     f"but the card says {base.card.prediction_type!r}; make them agree.")
    return f"{base.card.model_id!r}, {s.steps} steps of {base.card.sampling.sampler!r}"


def check_to(s: Subject) -> str:
    base, device, dtype = s.base, s.device, s.dtype
    before = s.need("the state before moving")
    kept = float32_paths(base)
    moved = snapshot(base)

    def wanted(name: str) -> torch.dtype | None:
        return torch.float32 if lies_within(name, kept) else dtype

    elsewhere = [k for k, v in moved.items() if v.device.type != device.type]
    wrong = [k for k, v in moved.items()
             if dtype is not None and v.is_floating_point() and v.dtype != wanted(k)]
    if elsewhere or wrong:
        raise Broken(f".to({device}{', ' + str(dtype) if dtype else ''}) left "
                     + "; ".join(filter(None, [elsewhere and f"{few(elsewhere)} off {device}",
                                               wrong and f"{few(wrong)} not {dtype}" + (
                                                   " (keep_in_float32() names the float32 ones)" if kept
                                                   else "")])))
    computing = next((p for n, p in base.named_parameters() if not lies_within(n, kept)), None)
    if computing is not None and (base.device.type != device.type or base.dtype != computing.dtype):
        raise Broken(f"base.device / base.dtype report {base.device} / {base.dtype}, the weights are on "
                     f"{computing.device} / {computing.dtype}.")
    if dtype is not None:
        before = {k: v.to(wanted(k)) if v.is_floating_point() else v for k, v in before.items()}
    changed = differing(before, moved)
    if changed:
        raise Broken(f"moving changed the values of {few(changed)}.")
    held = [k for k, v in moved.items() if v.is_floating_point() and lies_within(k, kept)]
    note = f"; {len(held)} kept in float32" if held else ""
    dtypes = {v.dtype for k, v in moved.items() if v.is_floating_point() and not lies_within(k, kept)}
    uniform = dtypes.pop() if len(dtypes) == 1 else None  # float64 holds every float dtype exactly
    if device.type != "cpu":
        base.to("cpu") if uniform is None else base.to("cpu", torch.float64)
        base.to(device) if uniform is None else base.to(device, uniform)
    elif uniform is not None:
        base.to(torch.float64)
        base.to(uniform)
    else:
        return f"{len(moved)} tensors on {device}{note} (mixed precision on the CPU: no round trip to make)"
    after = snapshot(base)
    changed = differing(moved, after)
    if changed:
        raise Broken(f"a .to() round trip changed {few(changed)}.")
    return f"{len(moved)} tensors on {device}{note}, round trip bit-exact"


# -- the batch and the autoencoder ---------------------------------------------------------
def check_provides(s: Subject) -> str:
    base = s.base
    provided = base.provides()
    if not isinstance(provided, tuple) or not all(isinstance(n, str) for n in provided):
        raise Broken(f"provides() must return a tuple of str, got {provided!r}.")
    if len(set(provided)) != len(provided):
        raise Broken(f"provides() repeats names: {provided!r}.")
    batch = s.batch
    if not isinstance(batch, Batch):
        raise Broken(f"prepare_batch(raw) returned {type(batch).__name__}, not a workbench Batch.")
    problems = []
    z = batch.latents
    if not isinstance(z, torch.Tensor) or z.ndim != 5 or not z.is_floating_point():
        raise Broken(f"batch.latents must be a floating (B, C, T, H, W) tensor, got "
                     f"{tuple(getattr(z, 'shape', ()))} {getattr(z, 'dtype', type(z).__name__)}.")
    if z.requires_grad or z.grad_fn is not None:
        problems.append("batch.latents carry autograd history (run the encoder under torch.no_grad())")
    if z.device.type != base.device.type:
        problems.append(f"batch.latents is on {z.device}, the backbone on {base.device}")
    extra = sorted(set(batch.cond) - set(provided) - set(sampler_inputs(base)))
    if extra:
        problems.append(f"cond has {extra} that provides() does not name (add them to provides(), or to "
                        f"sampler_inputs if only the sampler reads them)")
    missing = [n for n in provided if n not in batch.cond]
    if missing:
        problems.append(f"provides() names {missing} but prepare_batch(raw) did not supply them "
                        f"(raw has keys {sorted(map(str, s.raw))}; give a raw batch holding every input, "
                        f"or fix the names)")
    if not set(batch.per_frame) <= set(batch.cond):
        problems.append(f"per_frame names {sorted(set(batch.per_frame) - set(batch.cond))}, "
                        f"which are not in cond")
    for key, value in batch.cond.items():
        if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] != z.shape[0]:
            problems.append(f"cond[{key!r}] has {value.shape[0]} rows for a batch of {z.shape[0]}")
        elif isinstance(value, torch.Tensor) and value.device.type != base.device.type:
            problems.append(f"cond[{key!r}] is on {value.device}, the backbone on {base.device}")
    if batch.loss_mask is not None and tuple(batch.loss_mask.shape) != (z.shape[0], z.shape[2]):
        problems.append(f"loss_mask is {tuple(batch.loss_mask.shape)}, "
                        f"expected (B, T') = {(z.shape[0], z.shape[2])}")
    if base.prepare_batch(batch) is not batch:
        problems.append("prepare_batch(batch) must return a Batch unchanged")
    if problems:
        raise Broken("; ".join(problems) + ".")
    return f"latents {tuple(z.shape)}, cond {sorted(batch.cond)}"


def check_encode_decode(s: Subject) -> str:
    if "video" not in s.raw:
        raise Skipped("raw has no 'video' to encode.")
    base, batch = s.base, s.batch
    video = as_video(s.raw["video"]).to(base.device)
    with torch.no_grad():
        z = base.encode(video)
        if not isinstance(z, torch.Tensor) or z.ndim != 5 or not z.is_floating_point():
            raise Broken(f"encode(video {tuple(video.shape)}) must return floating (B, C, T', h, w) "
                         f"latents, got {tuple(getattr(z, 'shape', ()))} {getattr(z, 'dtype', '')}.")
        if z.shape != batch.latents.shape:
            raise Broken(f"encode(video) is {tuple(z.shape)} but prepare_batch(raw).latents is "
                         f"{tuple(batch.latents.shape)}: the batch's latents must be the encoded video.")
        if not torch.allclose(z.float(), batch.latents.float(), **_tolerance(z.dtype)):
            raise Broken(f"prepare_batch(raw).latents are not encode(video): {max_diff(z, batch.latents)}.")
        x = base.decode(z)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or tuple(x.shape) != tuple(video.shape):
        raise Broken(f"decode(encode(video)) must be floating video of the input's shape "
                     f"{tuple(video.shape)}, got {tuple(getattr(x, 'shape', ()))} {getattr(x, 'dtype', '')}.")
    if not torch.isfinite(x).all() or float(x.abs().max()) > 1.0 + 1e-3:
        raise Broken(f"decode must return finite values in [-1, 1], got a range of [{float(x.min()):.3g}, "
                     f"{float(x.max()):.3g}].")
    return f"video {tuple(video.shape)} -> latents {tuple(z.shape)} {z.dtype} -> video {x.dtype}"


# -- composition ---------------------------------------------------------------------------
def check_identity(s: Subject) -> str:
    from workbench.core.composers import Add, GatedResidual

    base, batch = s.base, s.batch
    for composer in (Add(), GatedResidual()):
        model = s.model(composer).train()
        x_t, t, _ = model.noised(batch, s.generator())
        with torch.no_grad():
            pred = model.predict(x_t, t, batch, step=0)
        if pred.adapter is not None and bool((pred.adapter != 0).any()):
            raise Broken(f"the adapter from adapter_factory is not zero at init (max |output| "
                         f"{float(pred.adapter.abs().max()):.3g}); this promise needs one that is.")
        with torch.no_grad():
            frozen = base.denoise(x_t, t, batch.cond)
            again = base.denoise(x_t, t, batch.cond)
        if not torch.equal(frozen, again):
            raise Broken(f"denoise gave two answers for the same input ({max_diff(frozen, again)}): "
                         f"the frozen base must be deterministic (eval mode, no sampling inside).")
        if frozen.shape != x_t.shape or frozen.dtype != x_t.dtype:
            raise Broken(f"denoise returned {tuple(frozen.shape)} {frozen.dtype} for x_t {tuple(x_t.shape)} "
                         f"{x_t.dtype}; it must match x_t's shape and dtype.")
        if not torch.equal(pred.composed, frozen):
            raise Broken(f"{composer.describe()} with a zero adapter is not the frozen base bit for bit: "
                         f"{max_diff(pred.composed, frozen)} "
                         f"(is constrain() changing denoise's own output?).")
    return "Add and GatedResidual, bit-exact"


def check_given_frames(s: Subject) -> str:
    base, batch = s.base, s.batch
    mask = batch.loss_mask
    frames = batch.latents.shape[2]
    free = torch.ones(frames, dtype=torch.bool) if mask is None else (mask != 0).all(dim=0).cpu()
    given = torch.zeros_like(free) if mask is None else (mask == 0).all(dim=0).cpu()
    if isinstance(base, GivenFrames):
        g = s.generator()
        x_t, t, _ = s.model().noised(batch, g)
        with torch.no_grad():
            frozen = base.denoise(x_t, t, batch.cond)
            kept = base.constrain(frozen, x_t, t, batch.cond)
            any_pred = torch.randn(x_t.shape, generator=g, device=x_t.device).to(x_t.dtype)
            fixed = base.constrain(any_pred.clone(), x_t, t, batch.cond)
            twice = base.constrain(fixed.clone(), x_t, t, batch.cond)
        if not torch.equal(kept, frozen):
            raise Broken(f"constrain changes denoise's own prediction ({max_diff(kept, frozen)}); "
                         f"the base's output must already satisfy it.")
        if not torch.equal(twice, fixed):
            raise Broken(f"constrain is not idempotent: applied twice it moves again "
                         f"({max_diff(twice, fixed)}).")
        if not torch.equal(fixed[:, :, free.to(fixed.device)], any_pred[:, :, free.to(fixed.device)]):
            raise Broken("constrain changed frames the model predicts (loss_mask 1); "
                         "it may only fix given frames.")
    if not given.any():
        return ("constrain is the identity outside given frames (this batch has no given frames)"
                if isinstance(base, GivenFrames) else "this batch has no given frames (and no constrain)")
    gen = s.generation_batch
    given = torch.zeros_like(free) if gen.loss_mask is None else (gen.loss_mask == 0).all(dim=0).cpu()
    if not given.any():
        return "the generation batch has no given frames"
    final = s.model(perturbed=True).generate(gen, steps=s.steps, generator=s.generator(), **s.sampler_kwargs)
    idx, frames = given.to(final.device), given.nonzero().flatten().tolist()
    want = gen.latents[:, :, idx]
    if not torch.allclose(final[:, :, idx].float(), want.float(), **_tolerance(final.dtype)):
        raise Broken(f"with a nonzero adapter, sampling moved the given latent frames {frames} "
                     f"({max_diff(final[:, :, idx], want)}); the sampler must return them as given.")
    return f"given latent frames {frames} kept through sampling with a nonzero adapter"


# -- sampling: recording and forks ---------------------------------------------------------
def _rng_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def check_recording(s: Subject) -> str:
    from workbench.inspect import record

    model, batch, steps, kwargs = s.model(perturbed=True), s.generation_batch, s.steps, s.sampler_kwargs
    rng = _rng_states(s.device)
    with counting_base_calls(s.base) as calls:
        plain = model.generate(batch, steps=steps, generator=s.generator(), **kwargs)
    if any(not torch.equal(a, b) for a, b in zip(rng, _rng_states(s.device))):
        raise Broken("generate() drew from torch's global random generator; "
                     "the generator passed in must be the only randomness "
                     "(pass generator= to every torch.randn / randn_tensor).")
    if plain.shape != batch.latents.shape or plain.dtype != batch.latents.dtype:
        raise Broken(f"run_sampler returned {tuple(plain.shape)} {plain.dtype}; expected the batch's latents "
                     f"{tuple(batch.latents.shape)} {batch.latents.dtype}.")
    if calls[0] == 0 or calls[0] % steps:
        raise Broken(f"a {steps}-step run made {calls[0]} base predictions; "
                     f"every prediction must go through compose_fn, the same number of calls in every step.")
    again = model.generate(batch, steps=steps, generator=s.generator(), **kwargs)
    if not torch.equal(plain, again):
        raise Broken(f"two runs with the same generator differ ({max_diff(plain, again)}).")
    bare = s.base.generate(batch, steps=steps, generator=s.generator(), **kwargs)
    if torch.equal(plain, bare):
        raise Broken("a nonzero adapter changed nothing: "
                     "the sampler does not sample with compose_fn's predictions.")
    other = model.generate(batch, steps=steps, generator=s.generator(s.seed + 1), **kwargs)
    if torch.equal(plain, other):
        raise Broken("runs with different seeds are identical: the sampler ignores the generator.")
    traj = record(model, batch, steps=steps, seed=s.seed, **kwargs)
    if len(traj) != steps or not traj.complete:
        raise Broken(f"the recording holds {len(traj)} of {steps} steps.")
    if not torch.equal(traj.final, plain.to(traj.final.device)):
        raise Broken(f"the recorded run's final latents differ from the unrecorded run's "
                     f"({max_diff(traj.final, plain)}).")
    made, said = len(traj.log[0].calls), predictions_per_step(s.base, batch, **kwargs)
    if made != said:
        raise Broken(f"the sampler called compose_fn {made} time(s) in a step, "
                     f"but predictions_per_step(batch, **sampler_kwargs) says {said}: "
                     f"a recording keeps every call's prediction, so estimate_memory and "
                     f"StoragePolicy(max_bytes=...) would be off. Return the number of calls "
                     f"(one, plus one per guidance branch) for these sampler arguments.")
    s.keep("recording", (model, traj, calls[0] // steps))
    return f"{steps} steps, {calls[0] // steps} base call(s) per step, bit-exact"


def check_fork(s: Subject) -> str:
    model, traj, per_step = s.need("recording")
    steps = len(traj)
    at = s.fork_at if s.fork_at is not None else max(1, steps // 2)
    if not 0 < at < steps:
        raise Skipped(f"fork_at={at} leaves no prefix to replay in a {steps}-step run.")
    with counting_base_calls(s.base) as calls:
        fork = traj.fork(at=at)
    if calls[0] != (steps - at) * per_step:
        raise Broken(f"a fork at step {at} of {steps} made {calls[0]} base calls, expected "
                     f"{(steps - at) * per_step} ({per_step} per live step): "
                     f"the prefix must be replayed, not run.")
    for j in range(at + 1):
        if not torch.equal(fork[j].x_t, traj[j].x_t):
            raise Broken(f"the fork's x_t at step {j} differs from its parent's "
                         f"({max_diff(fork[j].x_t, traj[j].x_t)})"
                         f": the sampler's compose_fn calls are not in the same order every run.")
    if not torch.equal(fork.final, traj.final):
        raise Broken(f"an unchanged fork at step {at} does not end where its parent did "
                     f"({max_diff(fork.final, traj.final)}).")
    return f"fork at {at}: prefix bit-exact, {calls[0]} base calls"


# -- the clip ------------------------------------------------------------------------------
def _clips_like(s: Subject, clip) -> list[dict]:
    """Two clips of ``clip``'s size carrying what the raw batch carries: random frames, each per-frame signal
    and control video made at the clip's length and size, other conditions and text as given."""
    g = torch.Generator().manual_seed(s.seed + 17)
    video = torch.rand(2, 3, clip.frames, clip.height, clip.width, generator=g) * 2 - 1
    clips: list[dict] = [{"video": video[i]} for i in range(2)]
    source = s.raw.get("video")
    frames = as_video(source).shape[2] if source is not None else None
    for key, value in s.raw.items():
        if key in ("video", "latents", "image"):
            continue
        if isinstance(value, str):
            for c in clips:
                c[key] = value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            for i, c in enumerate(clips):
                c[key] = value[i % len(value)]
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim >= 2:
            if value.ndim == 5:  # a control video (B, C, T, H, W)
                made = torch.rand(2, value.shape[1], clip.frames, clip.height, clip.width,
                                  generator=g) * 2 - 1
            elif value.ndim == 3 and value.shape[1] == frames:  # a per-frame signal (B, T, D)
                made = torch.rand(2, clip.frames, value.shape[2], generator=g) * 2 - 1
            else:  # per clip (e.g. text embeddings)
                made = torch.stack([value[i % value.shape[0]] for i in range(2)])
            for i, c in enumerate(clips):
                c[key] = made[i]
    return clips


def check_clip(s: Subject) -> str:
    from workbench.inspect.recording.clips import generation_request, predict_clips
    from workbench.metrics import to_uint8_video

    base = s.base
    clip = base.clip()
    if not isinstance(clip, ClipSpec):
        raise Broken(f"clip() returned {type(clip).__name__}, not a workbench ClipSpec.")
    sizes = {"frames": clip.frames, "height": clip.height, "width": clip.width,
             "latent_frames": clip.latent_frames}
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        raise Broken(f"clip() states {bad}; frames, height, width and latent frames must be positive ints.")
    clips = _clips_like(s, clip)
    with torch.no_grad():
        latents = base.encode(torch.stack([c["video"] for c in clips]).to(base.device))
    if latents.shape[2] != clip.latent_frames:
        raise Broken(f"clip() says {clip.frames} frames make {clip.latent_frames} latent frames, "
                     f"encode() makes {latents.shape[2]}: latent_frames() must follow the autoencoder.")
    causal = causal_latents(base)
    if causal is not None and clip.latent_frames > 1:
        with torch.no_grad():
            alone = base.decode(latents[:1, :, :1]).shape[2]
        said = 1 if causal else clip.frames // clip.latent_frames
        if alone != said:
            layout = "a causal VAE" if causal else f"{said} frames per latent frame"
            raise Broken(f"causal_latents={causal} says latent frame 0 decodes to {said} frame(s) on its own "
                         f"({layout}), decode() makes {alone}: declare the layout the autoencoder has.")
    swapped = [{**c, **{k: v for k, v in clips[1 - i].items()
                        if isinstance(v, torch.Tensor) and k != "video"}}
               for i, c in enumerate(clips)]
    model = s.model(perturbed=True)
    steps = s.steps
    predicted = {"base": predict_clips(model, clips, steps=steps, seed=s.seed, with_adapter=False,
                                       **s.sampler_kwargs),
                 "adapter": predict_clips(model, clips, steps=steps, seed=s.seed, **s.sampler_kwargs),
                 "swapped": predict_clips(model, swapped, steps=steps, seed=s.seed, **s.sampler_kwargs)}
    want = (2, clip.frames, clip.height, clip.width, 3)
    wrong = {k: tuple(v.shape) for k, v in predicted.items()
             if tuple(v.shape) != want or v.dtype.name != "uint8"}
    if wrong:
        raise Broken(f"predicting 2 clips from what the backbone generates from gave videos of {wrong}; "
                     f"expected uint8 {want}, the clip clip() states.")
    limit = max_generate_batch(base) or 2
    alone = []
    for lo in range(0, 2, limit):  # the frozen base's own generate(), as predict_clips chunks and seeds it
        batch = base.prepare_batch(generation_request(base, clips[lo:lo + limit]))
        generator = torch.Generator(device=base.device).manual_seed(s.seed * 7919 + lo)
        with torch.no_grad():
            alone.append(to_uint8_video(base.decode(base.generate(batch, steps=steps, generator=generator,
                                                                 **s.sampler_kwargs))))
    if not (predicted["base"] == np.concatenate(alone)).all():
        raise Broken("the base's predictions with the adapter switched off are not the frozen base's own "
                     "generate() with the same noise.")
    fps = f" at {clip.fps:g} fps" if clip.fps else ""
    return (f"{clip.frames} frames of {clip.height}x{clip.width}{fps} -> {clip.latent_frames} latent frames; "
            f"2 clips predicted three ways (base, adapter, swapped conditions) at that size, "
            f"the base's bit-exact")


# -- rollouts ------------------------------------------------------------------------------
def check_rollout(s: Subject) -> str:
    from workbench.errors import InspectError
    from workbench.inspect import rollout
    from workbench.metrics import to_uint8_video

    base = s.base
    clip = base.clip()
    context = base.card.context_frames
    start = dict(_clips_like(s, clip)[0])
    width = int(torch.as_tensor(s.raw["action"]).shape[-1]) if "action" in s.raw else 4
    stride = clip.frames - max(context, 1)
    frames = clip.frames + stride  # two chunks
    actions = torch.rand(frames, width, generator=torch.Generator().manual_seed(s.seed + 23)) * 2 - 1
    model = s.model(perturbed=True)
    options = dict(steps=s.steps, seed=s.seed, state=None, **s.sampler_kwargs)
    if context == 0:
        try:
            rollout(model, start, actions, **options)
        except InspectError as err:
            raise Skipped(f"card.context_frames=0: no frame to continue from, "
                          f"and rollout refuses so: {err}") from None
        raise Broken("the card says context_frames=0 (no frame to continue from), "
                     "but rollout() did not refuse.")
    try:
        ro = rollout(model, start, actions, **options)
    except InspectError as err:
        if "generates from no image" in str(err):
            raise Skipped(f"{err} (set card.context_frames=0 to say so)") from None
        raise
    want = (frames, clip.height, clip.width, 3)
    if tuple(ro.video.shape) != want or ro.video.dtype != np.uint8 or len(ro.chunks) != 2:
        raise Broken(f"a rollout of {frames} frames gave {len(ro.chunks)} chunks and a video of "
                     f"{tuple(ro.video.shape)} {ro.video.dtype}; expected 2 chunks and uint8 {want}.")
    first, second = ro.chunks
    produced = first.produced[:, second.start - first.start]  # the frame chunk 1 continues from
    given = second.conditions.get("image")
    alone = ("; it declares decodes_frames_alone, so the frame was decoded alone: decode must give each "
             "frame the same values whatever frames it decodes with, or leave decodes_frames_alone False"
             if decodes_frames_alone(base) else "")
    if given is None or not np.array_equal(to_uint8_video(torch.as_tensor(given)[:, :, None])[:, 0],
                                           produced):
        raise Broken("chunk 1 was not generated from the last frame chunk 0 produced: "
                     "its request's 'image' differs (generation_inputs must take the image condition "
                     f"from the video's first frame{alone}).")
    bare = rollout(model, start, actions, store=False, **options)
    if not np.array_equal(bare.frame(-1), ro.video[-1]):  # read before its video: decoded alone, if declared
        raise Broken(f"rollout.frame(-1) differs from the last frame of the rollout's video{alone}.")
    if not np.array_equal(bare.video, ro.video):
        raise Broken(f"a recorded rollout and an unrecorded one differ "
                     f"(max {int(np.abs(bare.video.astype(int) - ro.video.astype(int)).max())} of 255).")
    return (f"2 chunks of {clip.frames} frames ({frames} frames), "
            f"chunk 1 from chunk 0's last produced frame; recorded == unrecorded, bit-exact")


# -- training and checkpoints --------------------------------------------------------------
def check_training(s: Subject) -> str:
    from workbench.core.composers import GatedResidual
    from workbench.train import AdapterExperiment, TrainingConfig

    base, batch = s.base, s.batch
    adapter, composer = s.place(s.adapter_factory()), s.place(GatedResidual())
    base.train()  # a user's stray .train() must not reach the frozen base
    before = snapshot(base)
    exp = AdapterExperiment(base=base, adapter=adapter, composer=composer, training=TrainingConfig(
        batch_size=batch.batch_size, learning_rate=1e-2, progress=False, device=s.device.type))
    trainable = exp.model.trainable_parameters()
    start = [p.detach().clone() for p in trainable]
    exp.fit([s.raw, s.raw], steps=2)
    problems = []
    if not all(torch.isfinite(torch.tensor(exp.loss_history))):
        problems.append(f"the training losses are {exp.loss_history}")
    changed = differing(before, snapshot(base))
    if changed:
        problems.append(f"training changed the frozen base: {few(changed)}")
    training = [n for n, m in base.named_modules() if m.training]
    if training:
        problems.append(f"base modules in train mode after .train(): "
                        f"{few([n or '(root)' for n in training])}")
    graded = [n for n, p in base.named_parameters() if p.requires_grad or p.grad is not None]
    if graded:
        problems.append(f"base parameters take gradients: {few(graded)}")
    optimized = {id(p) for group in exp.optimizer.param_groups for p in group["params"]}
    shared = {id(p) for p in base.parameters()} & optimized
    if shared:
        problems.append(f"{len(shared)} base parameters are in the optimizer")
    if all(torch.equal(a, p.detach()) for a, p in zip(start, trainable)):
        problems.append("no trainable parameter changed in two optimizer steps")
    if problems:
        raise Broken("; ".join(problems) + ".")
    return f"2 fit steps, losses {[round(v, 4) for v in exp.loss_history]}; base bit-identical, in eval mode"


def check_state_dict(s: Subject) -> str:
    base, model = s.base, s.model()
    state = model.trainable_state_dict()
    stray = [k for k in state if not k.startswith(("adapter.", "composer."))]
    storages = {v.untyped_storage().data_ptr() for v in tensors(base).values() if v.numel()}
    leaked = [k for k, v in state.items() if v.numel() and v.untyped_storage().data_ptr() in storages]
    if stray or leaked:
        raise Broken("; ".join(filter(None, [stray and f"keys outside adapter./composer.: {few(stray)}",
                                             leaked and f"base weights saved as {few(leaked)}"])) + ".")
    size = sum(v.numel() for v in state.values())
    return f"{len(state)} tensors, {size} values, none of the base's"


# -- what a backbone declares beyond the required part ----------------------------------------
def _items(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The raw batch's items, as a dataset serves them: row ``i`` of every batched value (others as given)."""
    n = int(torch.as_tensor(raw["video"]).shape[0])

    def row(value: Any, i: int) -> Any:
        if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == n:
            return value[i]
        if isinstance(value, (list, tuple)) and len(value) == n:
            return value[i]
        return value

    return [{k: row(v, i) for k, v in raw.items()} for i in range(n)]


def _batch_differences(got: Batch, want: Batch) -> list[str]:
    problems = []
    if got.latents.shape != want.latents.shape or not torch.equal(got.latents, want.latents):
        problems.append(f"latents ({max_diff(got.latents, want.latents)})")
    if sorted(got.cond) != sorted(want.cond):
        problems.append(f"cond keys {sorted(got.cond)} vs {sorted(want.cond)}")
    for key in sorted(set(got.cond) & set(want.cond)):
        a, b = got.cond[key], want.cond[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or not torch.equal(a, b):
                problems.append(f"cond[{key!r}] ({max_diff(a, b)})")
        elif a != b:
            problems.append(f"cond[{key!r}]")
    if (got.loss_mask is None) != (want.loss_mask is None) or (
            got.loss_mask is not None and not torch.equal(got.loss_mask, want.loss_mask)):
        problems.append("loss_mask")
    return problems


def check_latent_cache(s: Subject) -> str:
    from torch.utils.data import default_collate

    base, raw = s.base, s.raw
    if "video" not in raw:
        raise Skipped("raw has no 'video' to encode ahead.")
    items = _items(raw)
    with torch.no_grad():
        cached = [base.encode_item(item) for item in items]
    empty = [i for i, c in enumerate(cached) if c is None]
    if empty:
        raise Broken(f"encode_item returned None for item {empty[0]} of the raw batch, which holds a "
                     f"'video': the items a latent cache is made of must come back encoded.")
    away = sorted({k for c in cached for k, v in c.items()
                   if isinstance(v, torch.Tensor) and v.device.type != "cpu"})
    if away:
        raise Broken(f"encode_item left {few(away)} off the CPU; a cached item is written to disk and "
                     f"collated with the others on the CPU (return .cpu() tensors).")
    with torch.no_grad():
        want = base.prepare_batch(default_collate(items))
        got = base.prepare_batch(default_collate(cached))
    problems = _batch_differences(got, want)
    if problems:
        raise Broken(f"prepare_batch of the collated cached items differs from prepare_batch of the "
                     f"collated raw items in {'; '.join(problems)}. A cache must change nothing: run the "
                     f"frozen encoders clip by clip in prepare_batch too (a VAE's kernels need not be "
                     f"batch-invariant).")
    return (f"{len(items)} items cached as {sorted(cached[0])}; prepare_batch of them is the raw items', "
            f"bit-exact")


def check_inside(s: Subject) -> str:
    from workbench.core.inside import InsideSpec

    base = s.base
    spec = base.inside_spec()
    if not isinstance(spec, InsideSpec):
        raise Broken(f"inside_spec() returned {type(spec).__name__}, not a workbench.InsideSpec.")
    named = {id(m): n for n, m in base.named_modules()}
    where = named.get(id(spec.root))
    if where is None:
        raise Broken(f"inside_spec().root ({type(spec.root).__name__}) is not a submodule of the backbone: "
                     f"adapters inside it would not move, freeze or save with the base.")
    if where != spec.root_name:
        raise Broken(f"inside_spec().root_name is {spec.root_name!r}, but the root is the backbone's "
                     f"{where!r}: exported LoRA keys are prefixed with root_name.")
    inner = {id(m) for m in spec.root.modules()}
    outside = [i for i, b in enumerate(spec.blocks) if id(b) not in inner]
    if outside:
        raise Broken(f"inside_spec().blocks {outside} are not inside its root {spec.root_name!r}.")
    targets = [n for n, _ in spec.root.named_modules()
               if any(n == t or n.endswith("." + t) for t in spec.lora_targets)]
    if spec.lora_targets and not targets:
        raise Broken(f"inside_spec().lora_targets {list(spec.lora_targets)} name no module under "
                     f"{spec.root_name!r} (LoRA matches them as name suffixes).")
    return (f"root {spec.root_name!r}, {len(spec.blocks)} blocks laid out as {spec.layout!r}, "
            f"{len(targets)} modules its LoRA targets match (check_inside_adapter checks the adapters "
            f"themselves)")


def check_compile(s: Subject) -> str:
    base = s.base
    net = base.compile_target()
    named = {id(m): n for n, m in base.named_modules()}
    if not isinstance(net, nn.Module) or id(net) not in named or net is base:
        raise Broken(f"compile_target() returned {type(net).__name__}; it must be the network every "
                     f"prediction runs through, a submodule of the backbone.")
    return f"compiles {named[id(net)]!r} ({type(net).__name__})"


def check_memory_plan(s: Subject) -> str:
    base = s.base
    clip = base.clip()
    shape = tuple(base.latent_shape(clip))
    video = torch.zeros(1, 3, clip.frames, clip.height, clip.width, device=base.device)
    with torch.no_grad():
        encoded = base.encode(video)
    if shape != tuple(encoded.shape[1:]):
        raise Broken(f"latent_shape(clip()) says {shape}, encode() of a clip of that size makes "
                     f"{tuple(encoded.shape[1:])}: a memory plan would trace the wrong latents.")
    latents = torch.zeros_like(encoded)
    t, cond = base.planning_inputs(latents)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != (1,) or not isinstance(cond, Mapping):
        raise Broken(f"planning_inputs(latents) must return (t (B,), cond mapping), got "
                     f"({tuple(getattr(t, 'shape', ()))}, {type(cond).__name__}) for latents of batch 1.")
    with torch.no_grad():
        out = base.denoise(latents, t, cond)
    if tuple(out.shape) != tuple(latents.shape):
        raise Broken(f"denoise(latents, *planning_inputs(latents)) returned {tuple(out.shape)} for latents "
                     f"{tuple(latents.shape)}.")
    encoders, notes = base.frozen_encoders(), base.planning_notes()
    if not isinstance(encoders, tuple) or not all(isinstance(m, nn.Module) for m in encoders):
        raise Broken(f"frozen_encoders() must return a tuple of nn.Modules, got {encoders!r}.")
    if not isinstance(notes, tuple) or not all(isinstance(n, str) for n in notes):
        raise Broken(f"planning_notes() must return a tuple of str, got {notes!r}.")
    return (f"latent_shape {shape} is encode's; denoise runs on planning_inputs (cond {sorted(cond)}); "
            f"{len(encoders)} frozen encoder(s), {len(notes)} note(s)")


def check_previews(s: Subject) -> str:
    base = s.base
    decoder = base.preview_decoder()
    named = {id(m): n for n, m in base.named_modules()}
    if decoder is not None and (not isinstance(decoder, nn.Module) or id(decoder) not in named):
        raise Broken(f"preview_decoder() returned {type(decoder).__name__}; it must be the submodule "
                     f"decode() runs, or None.")
    identity = base.preview_identity()
    if identity is not None and (not isinstance(identity, str) or identity != base.preview_identity()):
        raise Broken(f"preview_identity() must return the same str every time (it keys the preview cache), "
                     f"or None; got {identity!r}.")
    if base.pixel_space and "video" in s.raw:
        z, video = s.batch.latents, as_video(s.raw["video"])
        if z.shape[1] != 3 or tuple(z.shape[2:]) != tuple(video.shape[2:]):
            raise Broken(f"pixel_space=True says the samples are the frames, but prepare_batch makes latents "
                         f"{tuple(z.shape)} of video {tuple(video.shape)}.")
    where = "none" if decoder is None else repr(named[id(decoder)])
    return f"decoder {where}, identity {'hashed' if identity is None else repr(identity)}, " \
           f"pixel_space {base.pixel_space}"


def check_callbacks(s: Subject) -> str:
    from workbench.core.callbacks import Callback

    made = s.base.callbacks()
    if not isinstance(made, tuple) or not all(isinstance(c, Callback) for c in made):
        raise Broken(f"callbacks() must return a tuple of workbench Callbacks, got {made!r}.")
    return f"{len(made)} callback(s): {', '.join(type(c).__name__ for c in made) or 'none'}"


PROMISES: dict[str, tuple[str, Callable[[Subject], str | None]]] = {
    "card": ("the card is a valid ModelCard and default_objective() predicts what it says", check_card),
    "to": (".to(device, dtype) moves every weight (what keep_in_float32() names stays float32), "
           "base.device/dtype follow, a round trip is bit-exact", check_to),
    "provides": ("provides() names exactly the conditions prepare_batch(raw) supplies", check_provides),
    "encode_decode": ("encode / decode shapes and dtypes; prepare_batch's latents are encode(video)",
                      check_encode_decode),
    "identity": ("a zero adapter composes to the frozen base, bit-exact", check_identity),
    "given_frames": ("sampling keeps given frames as given; a declared constrain fixes only them, "
                     "idempotently", check_given_frames),
    "recording": ("recorded == unrecorded sampling, bit-exact; the generator is the only randomness",
                  check_recording),
    "fork": ("a fork at k replays its prefix bit-exactly with N-k steps of model calls", check_fork),
    "clip": ("clip() states the clip it predicts; clips of that size predicted from what it generates from "
             "(base, adapter, swapped conditions) come out at that size", check_clip),
    "rollout": ("a two-chunk rollout continues from the frame(s) chunk 0 produced; recorded == unrecorded, "
                "bit-exact", check_rollout),
    "training": ("a training step changes only trainable parameters; "
                 "the base stays bit-identical, in eval mode",
                 check_training),
    "state_dict": ("the trainable state dict holds no base weights", check_state_dict),
    "latent_cache": ("CachesLatents: prepare_batch of encode_item's items is prepare_batch of the raw items, "
                     "bit-exact", check_latent_cache),
    "inside": ("InsideAccess: inside_spec() names a root inside the backbone, its blocks and LoRA targets",
               check_inside),
    "compile": ("Compilable: compile_target() is a submodule of the backbone", check_compile),
    "memory_plan": ("MemoryPlanning: latent_shape() is encode's, denoise runs on planning_inputs()",
                    check_memory_plan),
    "previews": ("Previews: preview_decoder() is a submodule, preview_identity() a stable str, "
                 "pixel_space latents are frames", check_previews),
    "callbacks": ("TrainingCallbacks: callbacks() is a tuple of workbench Callbacks", check_callbacks),
}
"""Promise name → (what it promises, its check), in checking order. The required part's promises come first;
those named in :data:`CAPABILITY_PROMISES` are checked for a backbone that declares the capability."""

CAPABILITY_PROMISES: dict[str, type] = {
    "latent_cache": CachesLatents, "inside": InsideAccess, "compile": Compilable,
    "memory_plan": MemoryPlanning, "previews": Previews, "callbacks": TrainingCallbacks}
"""Promise name → the capability (:mod:`workbench.core.capabilities`) whose members it checks. The other
capabilities a backbone may declare are checked inside the required promises: ``GivenFrames`` by
``given_frames``, ``SamplingOptions`` by ``provides``, ``recording``, ``clip`` and ``rollout``,
``LatentLayout`` by ``clip`` and ``rollout``, ``KeepsFloat32`` by ``to``."""


def check_backbone(make_backbone: Callable[[], BaseVideoModel] | BaseVideoModel, *,
                   raw: Mapping[str, Any] | None = None,
                   adapter_factory: Callable[[], Adapter] | None = None,
                   generate_raw: Mapping[str, Any] | None = None, steps: int | None = None,
                   fork_at: int | None = None, sampler_kwargs: Mapping[str, Any] | None = None,
                   device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int = 0,
                   promises: Iterable[str] | None = None, raise_on_broken: bool = True) -> ConformanceReport:
    """Check every promise of the backbone contract, and those of each optional capability the backbone
    declares (:mod:`workbench.core.capabilities`); raise one :class:`ConformanceError` listing the broken
    ones. The report says which capabilities it found (:attr:`ConformanceReport.declared`).

    Args:
        make_backbone: a callable returning the backbone (or the backbone itself). It is moved
            to ``device`` (and ``dtype``) and frozen by the checks.
        raw: a raw *training* batch for ``prepare_batch``, holding every input the backbone
            takes (video, each signal, prompts ...), so that every name in ``provides()`` is made.
            Default: the backbone's own :meth:`~workbench.BaseVideoModel.example_batch`.
        adapter_factory: a callable returning a fresh adapter that is zero at init and binds to
            this backbone (default :class:`ProbeAdapter`, which consumes nothing).
        generate_raw: what to sample from (default: the first clip of ``prepare_batch(raw)``).
        steps: the sampling request's steps (default: the card's).
        sampler_kwargs: the rest of the sampling request, e.g. ``{"guidance_scale": 4.0}`` to
            sample under guidance.
        fork_at: the step the fork check forks at (default ``steps // 2``).
        device: where the checks run.
        dtype: in what precision the checks run (``None`` keeps the backbone's own dtypes and moves
            it to ``device`` only). The backbone is moved with ``.to(device, dtype)`` (what it keeps
            in float32 stays so); adapters and composers run in the dtype of the latents
            ``prepare_batch`` makes.
        promises: names of the promises to check (default: the required ones and those of the
            capabilities it declares, see :data:`PROMISES`); a capability's promise named for a
            backbone that does not declare it is skipped, saying so.
        raise_on_broken: ``False`` returns the report instead of raising.

    Returns the :class:`ConformanceReport` when every promise checked holds.

    Examples:
        >>> from workbench.backbones.tiny_video import TinyVideo
        >>> report = check_backbone(lambda: TinyVideo(image_size=16, frames=4, width=16, ae_width=8, depth=1),
        ...                         steps=4, promises=["card", "identity", "recording"])
        >>> report.ok
        True
    """
    named = None if promises is None else _checked_names(promises, PROMISES)
    base = (make_backbone() if callable(make_backbone) and not isinstance(make_backbone, nn.Module)
            else make_backbone)
    device = torch.device(device)
    setting = f"{device}" + (f" {str(dtype).replace('torch.', '')}" if dtype is not None else "")
    if not isinstance(base, BaseVideoModel):
        report = ConformanceReport(type(base).__name__, setting, [Finding(
            "backbone", "make_backbone() returns a workbench BaseVideoModel", "broken",
            f"got {type(base).__name__}; subclass workbench.BaseVideoModel.")])
        raise ConformanceError(report)
    missing = unimplemented(base)
    if missing:
        report = ConformanceReport(type(base).__name__, setting, [Finding(
            "backbone", "implements every required method of the backbone contract", "broken",
            f"{type(base).__name__} leaves {len(missing)} of the {len(REQUIRED_METHODS)} required methods as "
            f"BaseVideoModel's stubs: {', '.join(missing)}. Implement each: its docstring on "
            f"workbench.BaseVideoModel says what it promises, "
            f"and docs/guides/writing-a-backbone.md lists them under 'The required part'.")])
        raise ConformanceError(report)
    has = declared(base)
    problems = [f"declares {name} but leaves {', '.join(members)} as its stub" for name, members in
                unwritten(base).items()]
    problems += [f"sets {', '.join(members)} of {name} without declaring {name}, so workbench never uses "
                 f"{'it' if len(members) == 1 else 'them'}" for name, members in undeclared(base).items()]
    if problems:
        report = ConformanceReport(type(base).__name__, setting, [Finding(
            "capabilities", "writes the members of the capabilities it declares, and declares those it "
            "writes", "broken", f"{type(base).__name__} " + "; ".join(problems) + ". Write each member "
            "(its docstring in workbench.core.capabilities says what it promises) and list each capability "
            "among the bases.")], declared=tuple(c.__name__ for c in has))
        raise ConformanceError(report)
    wanted = named if named is not None else [
        p for p in PROMISES if p not in CAPABILITY_PROMISES or CAPABILITY_PROMISES[p] in has]
    if raw is None:
        raw = example_batch_of(base)
    if not isinstance(raw, Mapping):
        raise TypeError(f"raw must be a mapping (a raw training batch), got {type(raw).__name__}.")
    name = getattr(base.card, "model_id", None) or "?"
    report = ConformanceReport(f"{type(base).__name__} ({name})", setting,
                               declared=tuple(c.__name__ for c in has))
    subject = Subject(base, raw=raw, generate_raw=generate_raw,
                      adapter_factory=adapter_factory or ProbeAdapter, steps=steps, fork_at=fork_at,
                      sampler_kwargs=sampler_kwargs or {}, device=device, dtype=dtype, seed=seed)
    try:
        subject.keep("the state before moving", snapshot(base))
        base.to(device) if dtype is None else base.to(device, dtype)
    except Exception as err:
        subject.failed["moving the backbone"] = f"base.to({setting}) raised {type(err).__name__}: {err}"
    for promise in wanted:
        statement, check = PROMISES[promise]
        capability = CAPABILITY_PROMISES.get(promise)
        try:
            if capability is not None and capability not in has:
                raise Skipped(f"{type(base).__name__} does not declare {capability.__name__}.")
            detail = check(subject) or ""
            finding = Finding(promise, statement, "kept", detail)
        except Broken as err:
            finding = Finding(promise, statement, "broken", str(err))
        except Skipped as err:
            finding = Finding(promise, statement, "skipped", str(err))
        except Blocked as err:
            finding = Finding(promise, statement, "not checked", str(err))
        except Exception as err:  # the backbone raised: that is the finding
            finding = Finding(promise, statement, "broken", f"raised {type(err).__name__}: {err}")
        report.findings.append(finding)
    if report.broken and raise_on_broken:
        raise ConformanceError(report)
    return report


def example_batch_of(base: BaseVideoModel) -> Mapping[str, Any]:
    """``base.example_batch()``, or a TypeError saying to declare one or pass ``raw``."""
    try:
        return base.example_batch()
    except NotImplementedError as err:
        raise TypeError(f"No raw batch to check with: raw was not given and {err}") from None


def _checked_names(names: Iterable[str], known: Mapping[str, Any]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"Unknown promise {unknown[0]!r}; the promises are {listing(known)}."
                         f"{did_you_mean(unknown[0], known)}")
    return names


__all__ = ["CAPABILITY_PROMISES", "PROMISES", "check_backbone"]
