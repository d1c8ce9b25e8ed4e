"""The backbone contract: a frozen pretrained video model the adapters sit on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.core.capabilities import (
    Compilable,
    GivenFrames,
    InsideAccess,
    KeepsFloat32,
    LatentLayout,
    Previews,
    SamplingOptions,
    TrainingCallbacks,
    undeclared,
)
from workbench.core.card import ClipSpec, ModelCard
from workbench.core.conditions import Batch
from workbench.errors import CardError, CompositionError, DataError

ComposeFn = Callable[[torch.Tensor, torch.Tensor, Batch], torch.Tensor]


@dataclass
class StepRecord:
    """What every native sampler reports after each step (one shape for all samplers).

    ``t`` is in the objective's units (``(B,)``); ``x_t`` entered the step, ``prediction`` is
    what the sampler used (composed when an adapter is injected), ``x_next`` left it.
    """

    index: int
    steps: int
    t: torch.Tensor
    x_t: torch.Tensor
    prediction: torch.Tensor
    x_next: torch.Tensor


OnStep = Callable[[StepRecord], None]


def as_video(value: Any, key: str = "video") -> torch.Tensor:
    """A raw video as float ``(B, 3, T, H, W)`` in [-1, 1], from that or from uint8 ``(B, T, H, W, 3)``."""
    video = torch.as_tensor(value)
    if video.dtype == torch.uint8:
        if video.ndim != 5 or video.shape[-1] != 3:
            raise DataError(f"'{key}' as uint8 must be (B, T, H, W, 3), got {tuple(video.shape)}.")
        return video.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    if video.ndim != 5 or video.shape[1] != 3:
        raise DataError(f"'{key}' must be (B, 3, T, H, W) float in [-1, 1] or uint8 (B, T, H, W, 3), got "
                        f"{tuple(video.shape)} {video.dtype}.")
    return video.float()


CONTROL_KEY = "control"
"""The raw-batch key of a control video (edges, depth, ...): ``(B, C, T, H, W)``, passed to adapters as is."""


def control_video(raw: Mapping[str, Any], *, batch_size: int, frames: int, device: torch.device | str,
                  backbone: str) -> torch.Tensor | None:
    """The raw batch's control video ``"control"`` as float ``(B, C, T, H, W)`` on ``device``;
    ``None`` when absent.

    A control video is a per-pixel condition (an edge map, a depth map, a segmentation, ...) with
    any channel count ``C`` and any frame size (an adapter resizes it to its own grid); it must
    have the clip's batch size and frame count ``frames`` (pixel frames). Backbones put it into
    ``cond["control"]`` unchanged: it is not a per-frame signal (its axis 1 is channels).
    """
    value = raw.get(CONTROL_KEY)
    if value is None:
        return None
    video = torch.as_tensor(value)
    if video.ndim != 5 or not video.is_floating_point():
        raise DataError(
            f"{backbone}: '{CONTROL_KEY}' must be a float control video (B, C, T, H, W) "
            f"(e.g. edges or depth in [-1, 1], C channels), got {tuple(video.shape)} {video.dtype}. "
            f"Convert it to that layout "
            f"(a single (B, T, H, W) map: add the channel axis with control[:, None])."
        )
    if video.shape[0] != batch_size or video.shape[2] != frames:
        raise DataError(
            f"{backbone}: '{CONTROL_KEY}' must cover the clip: (B={batch_size}, C, T={frames}, H, W), got "
            f"{tuple(video.shape)}. Give one control frame per video frame."
        )
    return video.to(device=device, dtype=torch.float32)


def example_inputs(clip: ClipSpec, batch_size: int = 2, *, generator: torch.Generator | None = None,
                   per_frame: Mapping[str, int] | None = None, per_clip: Mapping[str, int] | None = None,
                   control_channels: int | None = 1) -> dict[str, torch.Tensor]:
    """Random raw inputs of one ``clip``'s size, on the CPU, drawn from ``generator`` only.

    ``"video"`` ``(B, 3, T, H, W)`` in [-1, 1]; each ``per_frame`` signal ``name: D`` as ``(B, T, D)``;
    each ``per_clip`` vector ``name: D`` as ``(B, D)``; a control video ``"control"``
    ``(B, control_channels, T, H, W)`` unless ``control_channels`` is ``None``. The building block of
    :meth:`BaseVideoModel.example_batch`.
    """
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    b, t, h, w = batch_size, clip.frames, clip.height, clip.width
    raw = {"video": torch.rand(b, 3, t, h, w, generator=g) * 2 - 1}
    raw.update({name: torch.rand(b, t, d, generator=g) for name, d in (per_frame or {}).items()})
    raw.update({name: torch.rand(b, d, generator=g) for name, d in (per_clip or {}).items()})
    if control_channels is not None:
        raw[CONTROL_KEY] = torch.rand(b, control_channels, t, h, w, generator=g) * 2 - 1
    return raw


class BaseVideoModel(nn.Module):
    """A frozen video diffusion / flow model: the required part of the backbone contract.

    A backbone **must** set :attr:`card` and implement :meth:`provides`, :meth:`prepare_batch`,
    :meth:`encode`, :meth:`decode`, :meth:`denoise`, :meth:`default_objective` and
    :meth:`run_sampler` (its native sampler), and declare :meth:`example_batch` (a raw batch holding
    every input it takes, which the conformance kit, the benchmarks, the tests and the docs use).
    That is all a backbone needs (:data:`REQUIRED_METHODS`, the card, the example batch).

    What only some backbones have (a given first frame, latent caching, adapters inside the base,
    memory plans, layers kept in float32, ...) is declared on the side, by listing a capability of
    :mod:`workbench.core.capabilities` among the class's bases; the functions below this class
    (:func:`constrain`, :func:`max_generate_batch`, ...) read a capability's member off any
    backbone, with its one default for a backbone that does not declare it. Callers use
    :meth:`generate` (which fills the request from the card, checks it and calls
    :meth:`run_sampler`), :meth:`clip`, :meth:`compile`, :attr:`device` and :attr:`dtype`.

    ``workbench.testing.check_backbone`` checks every promise made here, and those of each
    capability a backbone declares, in one call.
    """

    # -- attributes: class-level defaults, set on the subclass or in ``__init__`` ----------------
    card: ModelCard | None = None
    """The validated :class:`ModelCard` (required; ``None`` only until ``__init__`` sets it)."""

    config: Any = None
    """The backbone's validated config (a ``config_class`` instance), or ``None``."""

    config_class: type | None = None
    """The dataclass ``config:`` blocks are validated by (``__init__(config=None, **overrides)``)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        written = undeclared(cls)
        if written:
            name, members = next(iter(written.items()))
            raise TypeError(
                f"{cls.__name__} writes {', '.join(members)} of the {name} capability without "
                f"declaring it, so workbench would never use {'it' if len(members) == 1 else 'them'}. "
                f"Add {name} to its bases (from workbench.core.capabilities import {name})."
            )

    @classmethod
    def config_from(cls, config: Any | None, overrides: Mapping[str, Any]) -> Any:
        """For ``__init__(config=None, **overrides)``: ``config``, or ``config_class(**overrides)``.

        Both at once is a TypeError (see :func:`workbench.config.config_from`, the convention every
        component follows).
        """
        from workbench.config import config_from

        return config_from(cls, config, overrides)

    # -- data --------------------------------------------------------------------------------
    def provides(self) -> tuple[str, ...]:
        """Names of the conditions :meth:`prepare_batch` supplies (what adapters may consume).

        Every name appears in ``prepare_batch(raw).cond`` when ``raw`` holds its source, and
        every ``cond`` key is either here or in :func:`sampler_inputs`.
        """
        raise NotImplementedError

    def example_batch(self, batch_size: int = 2, *,
                      generator: torch.Generator | None = None) -> dict[str, Any]:
        """A raw batch of random data holding **every** input this backbone takes, at its clip's size.

        :meth:`prepare_batch` of it supplies every name in :meth:`provides`; the conformance kit
        (``check_backbone(make)`` without ``raw``), ``benchmarks/gpu_check.py``, the tests and the
        docs use it, so no caller writes a batch by hand that goes stale when an input is added.
        Tensors are on the CPU, drawn from ``generator`` only (default: seeded 0). The default
        raises; a backbone declares its own, usually with :func:`example_inputs`.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not declare an example batch. Define example_batch(batch_size=2, *, "
            f"generator=None) returning a raw batch with every input it takes (see "
            f"workbench.core.backbone.example_inputs), or pass raw=... where one is asked for."
        )

    def prepare_batch(self, raw: Mapping[str, Any] | Batch) -> Batch:
        """Raw data (video, actions, prompts, ...) → :class:`Batch` of clean latents and conditions.

        A :class:`Batch` is returned unchanged. Tensors land on :attr:`device`; ``latents`` are
        :meth:`encode` of the video ``(B, C, T', h, w)``; every tensor condition has the batch's
        ``B`` rows; ``loss_mask`` ``(B, T')`` is 0 on latent frames the model is given (e.g. a
        conditioning first frame), which the sampler keeps.
        """
        raise NotImplementedError

    # -- autoencoder -------------------------------------------------------------------------
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] → floating latents ``(B, C, T', H', W')`` on
        :attr:`device`."""
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``(B, C, T', H', W')`` → floating video ``(B, 3, T, H, W)`` in [-1, 1]."""
        raise NotImplementedError

    # -- the model ---------------------------------------------------------------------------
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        """The frozen model's prediction at ``x_t`` ``(B, C, T', h, w)``, in ``x_t``'s dtype.

        ``t`` ``(B,)`` is in the objective's units; ``cond`` is a batch's ``cond``. Inside a
        sampler this is the base's part of every composed prediction, so it must be
        deterministic (no dropout: the base is frozen in eval mode) and, for a backbone with
        :class:`~workbench.core.capabilities.GivenFrames`, already satisfy its ``constrain``.
        """
        raise NotImplementedError

    def default_objective(self):
        """The :class:`Objective` this backbone was trained with (used when a config names none).

        Its ``prediction_type`` is the card's.
        """
        raise NotImplementedError

    def weight_files(self) -> tuple[Path, ...]:
        """The files this backbone's frozen weights were read from, every one whose contents decide
        what it computes (a text encoder loaded later included); ``()`` when no file holds them (a
        random init, weights changed in memory after loading). A run records a digest of these files
        as its base, or of the state dict where there are none, and refuses to continue on a base
        whose digest differs (:mod:`workbench.train.provenance`). Default ``()``."""
        return ()

    # -- sampling ----------------------------------------------------------------------------
    def run_sampler(self, batch: Batch, *, steps: int, sampler: str, generator: torch.Generator | None,
                    compose_fn: ComposeFn, on_step: OnStep | None, **kwargs) -> torch.Tensor:
        """The backbone's own native sampler (its loop, or its upstream pipeline); returns final latents.

        Called by :meth:`generate` under ``no_grad`` with a prepared ``batch``, the card-checked
        ``steps`` and ``sampler``, and ``kwargs`` from the request (e.g. ``guidance_scale``;
        recordings and forks pass the same ones again). The result has ``batch.latents``' shape
        and dtype. The rules that make recording, forks and ablations exact:

        * **Every prediction goes through** ``compose_fn(x_t, t, batch)`` (``t`` ``(B,)`` in the
          objective's units, ``batch`` the one the prediction is for, e.g. the unconditional
          half under guidance): never ``denoise`` directly, never a prediction kept from an
          earlier call. The calls of a step come **in the same order every run**: a fork
          replays its prefix by call position, without any model call.
        * ``on_step`` (when not ``None``) is called **once per step, after that step's**
          ``compose_fn`` **calls**, in order, with ``StepRecord(index, steps, t, x_t,
          prediction, x_next)``; ``prediction`` is what the update used.
        * **The generator is the only randomness**: the initial noise and any stochastic step
          draw from ``generator`` (on the batch's device), never from torch's global generator,
          so the same generator state gives bit-identical latents, recorded or not.
        * Frames the backbone is given (``loss_mask`` 0) come out as given.
        """
        raise NotImplementedError

    def generate(self, cond: Mapping[str, Any] | Batch, *, steps: int | None = None,
                 generator: torch.Generator | None = None, compose_fn: ComposeFn | None = None,
                 on_step: OnStep | None = None, sampler: str | None = None, **kwargs) -> torch.Tensor:
        """Run the backbone's own sampler (:meth:`run_sampler`); returns final latents.

        ``compose_fn(x_t, t, batch)`` replaces the base prediction at every step (this is how
        an adapter is injected; default: :meth:`denoise`); ``on_step`` receives a
        :class:`StepRecord` after each step. ``steps`` / ``sampler`` default to the card's and
        are checked against its recipe; ``kwargs`` go to :meth:`run_sampler`.
        """
        steps, sampler = self.card.resolve_steps(steps, sampler)
        batch = cond if isinstance(cond, Batch) else self.prepare_batch(cond)
        fn = compose_fn if compose_fn is not None else (lambda x, t, b: self.denoise(x, t, b.cond))
        with torch.no_grad():
            return self.run_sampler(batch, steps=steps, sampler=sampler, generator=generator,
                                    compose_fn=fn, on_step=on_step, **kwargs)

    # -- the clip ----------------------------------------------------------------------------
    def clip(self) -> ClipSpec:
        """The clip this backbone predicts: frames, height, width, fps and latent frames.

        By default the card's sampling defaults (``num_frames``, ``height``, ``width``, ``fps``)
        and :func:`latent_frames`; a card that leaves one of the first three out is refused with
        the fix. Evaluation, the demo, latent caches and dataset resizing read the clip size here.
        """
        card = self.card
        s = card.sampling if card is not None else None
        missing = [name for name in ("num_frames", "height", "width")
                   if s is None or getattr(s, name) is None]
        if missing:
            name = getattr(card, "model_id", None) or type(self).__name__
            raise CardError(
                f"{name!r} does not say the clip it predicts: its card's "
                f"sampling.{', sampling.'.join(missing)} {'is' if len(missing) == 1 else 'are'} None. "
                f"Set them in the card (SamplingDefaults(num_frames=..., height=..., width=...)), "
                f"or override {type(self).__name__}.clip()."
            )
        return ClipSpec(frames=s.num_frames, height=s.height, width=s.width, fps=s.fps,
                        latent_frames=latent_frames(self, s.num_frames))

    # -- compilation -------------------------------------------------------------------------
    def compile(self, *, backend: str = "inductor", mode: str | None = None, fullgraph: bool = False,
                options: Mapping[str, Any] | None = None) -> BaseVideoModel:
        """Run the denoiser (:func:`compile_target`) through ``torch.compile``; returns ``self``.

        What a config's ``compile: true`` does when the backbone is built. The network's
        ``forward`` is compiled with static shapes (``dynamic=False``) and with dynamo guarding
        its blocks' hooks, so recording, forks, ablations, inside adapters and ``fit`` work as
        they do eagerly (see :mod:`workbench.core.compiled`); the module, its parameter names
        and its state dict are unchanged. The first call of each input shape (and grad mode,
        adapter state) compiles, which takes seconds on a CPU. A second ``compile()`` changes
        nothing (the first one's options stay). ``backend`` / ``mode`` / ``fullgraph`` /
        ``options``: ``torch.compile``'s.

        Examples:
            >>> from workbench.backbones.tiny_video import TinyVideo
            >>> base = TinyVideo.from_pretrained().compile()     # compiles on the first prediction
            >>> base.compile() is base
            True
        """
        from workbench.core.compiled import compile_network

        if self.__dict__.get("_compiled_network") is None:
            net = compile_target(self)
            compile_network(net, backend=backend, mode=mode, fullgraph=fullgraph, options=options)
            # (not a submodule: it already is one, under its own name)
            self.__dict__["_compiled_network"] = net
        return self

    @property
    def is_compiled(self) -> bool:
        """Whether :meth:`compile` has compiled this backbone's denoiser."""
        from workbench.core.compiled import compiled_options

        net = self.__dict__.get("_compiled_network")
        return net is not None and compiled_options(net) is not None

    # -- placement ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the backbone's first parameter lives (CPU without parameters)."""
        p = _first_parameter(self)
        return p.device if p is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the backbone computes in: its first parameter's outside what it keeps in float32
        (:class:`~workbench.core.capabilities.KeepsFloat32`; float32 without parameters)."""
        kept = float32_paths(self)
        if not kept:
            p = _first_parameter(self)
            return p.dtype if p is not None else torch.float32
        for name, p in self.named_parameters():
            if not lies_within(name, kept):
                return p.dtype
        return torch.float32

    def _apply(self, fn, recurse=True):
        kept = float32_paths(self)
        if not kept:
            return super()._apply(fn, recurse)
        ids = set()
        for name, t in (*self.named_parameters(), *self.named_buffers()):
            if lies_within(name, kept):
                ids.add(id(t))
                if t.grad is not None:
                    ids.add(id(t.grad))

        def keeping(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in ids or not t.is_floating_point():
                return fn(t)
            # where fn sends it: that device, in float32
            target = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            return t.to(device=target.device, dtype=torch.float32)

        return super()._apply(keeping, recurse)


# -- the capabilities' members, read off any backbone ------------------------------------------
# Each returns the backbone's own member when it declares the capability, else the capability's
# default: the one place that default is stated.
def constrain(base: BaseVideoModel, prediction: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
              cond: Mapping[str, Any]) -> torch.Tensor:
    """``base.constrain(...)`` (:class:`~workbench.core.capabilities.GivenFrames`), else ``prediction``."""
    return base.constrain(prediction, x_t, t, cond) if isinstance(base, GivenFrames) else prediction


def generation_inputs(base: BaseVideoModel, video: torch.Tensor) -> dict[str, Any]:
    """What a generation request takes from clips ``video`` ``(B, 3, T, H, W)`` it should reproduce
    (:meth:`SamplingOptions.generation_inputs
    <workbench.core.capabilities.SamplingOptions.generation_inputs>`)."""
    if isinstance(base, SamplingOptions):
        return base.generation_inputs(video)
    return SamplingOptions.generation_inputs(base, video)


def max_generate_batch(base: BaseVideoModel) -> int | None:
    """The most clips one ``generate`` call takes; ``None``: any number
    (:attr:`SamplingOptions.max_generate_batch
    <workbench.core.capabilities.SamplingOptions.max_generate_batch>`)."""
    if isinstance(base, SamplingOptions):
        return base.max_generate_batch
    return SamplingOptions.max_generate_batch


def sampler_inputs(base: BaseVideoModel) -> tuple[str, ...]:
    """The ``cond`` keys only the sampler reads
    (:attr:`SamplingOptions.sampler_inputs <workbench.core.capabilities.SamplingOptions.sampler_inputs>`)."""
    return tuple(base.sampler_inputs) if isinstance(base, SamplingOptions) else SamplingOptions.sampler_inputs


def predictions_per_step(base: BaseVideoModel, batch: Batch, **sampler_kwargs: Any) -> int:
    """How many ``compose_fn`` calls one sampling step makes for ``batch`` with these sampler arguments
    (:meth:`SamplingOptions.predictions_per_step
    <workbench.core.capabilities.SamplingOptions.predictions_per_step>`)."""
    if isinstance(base, SamplingOptions):
        return base.predictions_per_step(batch, **sampler_kwargs)
    return SamplingOptions.predictions_per_step(base, batch, **sampler_kwargs)


def latent_frames(base: BaseVideoModel, frames: int) -> int:
    """How many latent frames ``encode`` makes of ``frames`` pixel frames
    (:meth:`LatentLayout.latent_frames <workbench.core.capabilities.LatentLayout.latent_frames>`)."""
    if isinstance(base, LatentLayout):
        return base.latent_frames(frames)
    return LatentLayout.latent_frames(base, frames)


def causal_latents(base: BaseVideoModel) -> bool | None:
    """Whether the latents are a causal video VAE's; ``None``: not said
    (:attr:`LatentLayout.causal_latents <workbench.core.capabilities.LatentLayout.causal_latents>`)."""
    return base.causal_latents if isinstance(base, LatentLayout) else LatentLayout.causal_latents


def decodes_frames_alone(base: BaseVideoModel) -> bool:
    """Whether ``decode`` makes each frame from its own latent frame alone
    (:attr:`LatentLayout.decodes_frames_alone
    <workbench.core.capabilities.LatentLayout.decodes_frames_alone>`)."""
    if isinstance(base, LatentLayout):
        return bool(base.decodes_frames_alone)
    return LatentLayout.decodes_frames_alone


def pixel_space(base: BaseVideoModel) -> bool | None:
    """Whether the samples are the frames themselves; ``None``: to be inferred
    (:attr:`Previews.pixel_space <workbench.core.capabilities.Previews.pixel_space>`)."""
    return base.pixel_space if isinstance(base, Previews) else Previews.pixel_space


def preview_decoder(base: BaseVideoModel) -> nn.Module | None:
    """The module ``decode`` runs, or ``None``
    (:meth:`Previews.preview_decoder <workbench.core.capabilities.Previews.preview_decoder>`)."""
    return base.preview_decoder() if isinstance(base, Previews) else Previews.preview_decoder(base)


def preview_identity(base: BaseVideoModel) -> str | None:
    """A name for what ``decode`` computes, or ``None``: hash the decoder's weights
    (:meth:`Previews.preview_identity <workbench.core.capabilities.Previews.preview_identity>`)."""
    return base.preview_identity() if isinstance(base, Previews) else Previews.preview_identity(base)


def float32_paths(base: BaseVideoModel) -> tuple[str, ...]:
    """The dotted paths ``base`` keeps in float32
    (:meth:`KeepsFloat32.keep_in_float32 <workbench.core.capabilities.KeepsFloat32.keep_in_float32>`);
    ``()`` when it does not declare it. Asked once per backbone object, once it has modules."""
    if not isinstance(base, KeepsFloat32):
        return ()
    cached = base.__dict__.get("_float32_cache")
    if cached is None:
        cached = tuple(base.keep_in_float32())
        if cached:  # (a backbone still being built may not have its modules yet: ask again next time)
            base.__dict__["_float32_cache"] = cached
    return cached


def lies_within(name: str, paths: tuple[str, ...]) -> bool:
    """``name`` (a dotted parameter path) is one of ``paths`` or lies inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in paths)


def backbone_callbacks(base: BaseVideoModel) -> tuple:
    """The callbacks ``base`` brings to a training run
    (:class:`~workbench.core.capabilities.TrainingCallbacks`); ``()`` when it does not declare it."""
    return tuple(base.callbacks()) if isinstance(base, TrainingCallbacks) else ()


def compile_target(base: BaseVideoModel) -> nn.Module:
    """The network :meth:`BaseVideoModel.compile` compiles: ``base.compile_target()``
    (:class:`~workbench.core.capabilities.Compilable`), else the root of its ``inside_spec()``
    (:class:`~workbench.core.capabilities.InsideAccess`); a CompositionError when it declares neither."""
    if isinstance(base, Compilable):
        return base.compile_target()
    if isinstance(base, InsideAccess):
        return base.inside_spec().root
    raise CompositionError(
        f"{type(base).__name__} does not say which network to compile: compile() compiles the network "
        f"every prediction runs through, which a backbone names by declaring InsideAccess (the root of its "
        f"inside_spec()) or Compilable (compile_target()). It declares neither; add one to its bases "
        f"(from workbench.core.capabilities import InsideAccess, Compilable)."
    )


def _first_parameter(module: nn.Module) -> torch.Tensor | None:
    """``next(module.parameters(), None)`` without building the generators (read on every rendered step)."""
    for p in module._parameters.values():
        if p is not None:
            return p
    for child in module._modules.values():
        if child is not None:
            p = _first_parameter(child)
            if p is not None:
                return p
    return None


def _eval_only(module: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(module, False)


def freeze(base: nn.Module) -> None:
    """Freeze for real: no gradients, eval mode, and eval mode that ``.train()`` cannot undo.

    Every submodule's ``train`` is pinned to eval, so a parent calling ``.train()`` (an
    experiment, a wrapper, the user's ``model.train()``) cannot silently switch the frozen
    base's dropout or batch norm back to training behaviour.
    """
    if not isinstance(base, nn.Module):
        raise CompositionError(f"The base must be an nn.Module (a BaseVideoModel), "
                               f"got {type(base).__name__}.")
    base.requires_grad_(False)
    for m in base.modules():
        m.train = _eval_only.__get__(m)  # type: ignore[method-assign]
    nn.Module.train(base, False)


#: The methods every backbone implements (the table in docs/guides/writing-a-backbone.md, "The required part",
#: with the card); the rest of :class:`BaseVideoModel` is what callers use. ``example_batch`` is required too,
#: except by code that is handed a raw batch instead (``check_backbone(make, raw=...)``), and says so itself.
REQUIRED_METHODS = ("provides", "prepare_batch", "encode", "decode", "denoise", "default_objective",
                    "run_sampler")


def unimplemented(backbone: type[BaseVideoModel] | BaseVideoModel) -> tuple[str, ...]:
    """The :data:`REQUIRED_METHODS` that ``backbone`` (a class or an instance) leaves as
    :class:`BaseVideoModel`'s own stubs, in that order; ``()`` when it implements them all.

    Examples:
        >>> from workbench.backbones.tiny_video import TinyVideo
        >>> unimplemented(TinyVideo)
        ()
    """
    cls = backbone if isinstance(backbone, type) else type(backbone)
    return tuple(name for name in REQUIRED_METHODS if getattr(cls, name) is getattr(BaseVideoModel, name))
