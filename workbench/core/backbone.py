"""The backbone contract: a frozen pretrained video model the adapters sit on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.core.card import IMAGE_MODES, ModelCard
from workbench.core.conditions import Batch
from workbench.core.inside import InsideSpec
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


@dataclass(frozen=True)
class ClipSpec:
    """The clip a backbone predicts, as its card's sampling defaults say (see :meth:`BaseVideoModel.clip`).

    ``frames`` pixel frames of ``height`` x ``width`` at ``fps`` frames per second (``None``:
    not stated), which :meth:`BaseVideoModel.encode` turns into ``latent_frames`` latent frames.
    Every command that makes or reads clips for a backbone (evaluation, the demo, latent caches,
    dataset resizing) asks this, never a backbone's own config fields.
    """

    frames: int
    height: int
    width: int
    fps: float | None
    latent_frames: int

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)``."""
        return self.height, self.width


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
    """A frozen video diffusion / flow model: the whole backbone contract, declared here.

    A backbone **must** set :attr:`card` and implement :meth:`provides`, :meth:`prepare_batch`,
    :meth:`encode`, :meth:`decode`, :meth:`denoise`, :meth:`default_objective` and
    :meth:`run_sampler` (its native sampler), and declare :meth:`example_batch` (a raw batch holding
    every input it takes, which the conformance kit, the benchmarks, the tests and the docs use).
    It **may** override :meth:`constrain`,
    :meth:`encode_item`, :meth:`callbacks` and set the attributes below; each default here is
    the only one (nothing else in workbench guesses another). Callers use :meth:`generate`,
    which fills the request from the card, checks it and calls :meth:`run_sampler`.

    ``workbench.testing.check_backbone`` checks every promise made here in one call.
    """

    # -- attributes: class-level defaults, set on the subclass or in ``__init__`` ----------------
    card: ModelCard | None = None
    """The validated :class:`ModelCard` (required; ``None`` only until ``__init__`` sets it)."""

    config: Any = None
    """The backbone's validated config (a ``config_class`` instance), or ``None``."""

    config_class: type | None = None
    """The dataclass ``config:`` blocks are validated by (``__init__(config=None, **overrides)``)."""

    causal_latents: bool | None = None
    """How latent frames lay out in time. ``True``: a causal video VAE (frame 0 → latent frame 0,
    then ``r`` frames per latent frame; it is decoded whole, never in chunks); ``False``: ``r``
    frames per latent frame; ``None``: not declared, read off the decoded length (preferring
    ``r`` per latent frame when both readings fit)."""

    decodes_frames_alone: bool = False
    """``True`` when :meth:`decode` makes each frame from its own latent frame alone (a per-frame
    autoencoder, one latent frame per frame), the same values whatever other frames it decodes with (two
    or more at a time): a rollout then decodes only the frames it reads. ``False``: decoded whole."""

    pixel_space: bool | None = None
    """``True`` when the samples are the frames themselves (previews are the identity);
    ``None``: inferred (3-channel latents and no ``vae`` component in the card)."""

    preview_identity: Callable[[], str] | None = None
    """Optional method ``preview_identity() -> str`` naming what :meth:`decode` computes (e.g. the
    VAE checkpoint's hash), used as the latent-preview cache key instead of hashing the weights
    of :meth:`preview_decoder`. ``None``: hash them."""

    decoder_modules: tuple[str, ...] = ("vae", "autoencoder", "first_stage_model", "decoder")
    """Attribute names a preview looks under, in order, for the module :meth:`decode` runs
    (see :meth:`preview_decoder`)."""

    sampler_inputs: tuple[str, ...] = ()
    """Keys :meth:`prepare_batch` puts in ``cond`` for :meth:`run_sampler` only, not as conditions
    an adapter may consume (so not in :meth:`provides`), e.g. the first frame's pixels that an
    image-to-video pipeline encodes itself."""

    max_generate_batch: int | None = None
    """The most clips one :meth:`generate` call takes (e.g. 1 for a pipeline that conditions every
    sample on one image); ``None``: any number. Callers that predict many clips split them so."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "_generate" in vars(cls) and "run_sampler" not in vars(cls):
            raise TypeError(f"{cls.__qualname__} defines _generate: "
                            f"the sampler hook is called run_sampler now "
                            f"(same arguments). Rename the method.")

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
        every ``cond`` key is either here or in :attr:`sampler_inputs`.
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

    def encode_item(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """One raw dataset item with the frozen base's work done ahead, or ``None`` if there is none.

        Returns the item with its heavy, frozen part replaced by what :meth:`prepare_batch`
        accepts instead after collation (e.g. ``"video"`` → ``"latents"``, on the CPU).
        ``training.cache_latents`` calls it once per item and reuses the result.
        """
        return None

    # -- the clip ----------------------------------------------------------------------------
    def clip(self) -> ClipSpec:
        """The clip this backbone predicts: frames, height, width, fps and latent frames.

        By default the card's sampling defaults (``num_frames``, ``height``, ``width``, ``fps``)
        and :meth:`latent_frames`; a card that leaves one of the first three out is refused with
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
                        latent_frames=self.latent_frames(s.num_frames))

    def generation_inputs(self, video: torch.Tensor) -> dict[str, Any]:
        """What a generation request takes from clips it should reproduce, ``video`` ``(B, 3, T, H, W)``.

        By default, for a card serving an image-to-video mode (``i2v`` / ``ti2v``), the first frames
        ``{"image": (B, 3, H, W)}``; otherwise the clip's size ``{"frames": T, "height": H, "width": W}``.
        A backbone given more frames overrides it (e.g. an interpolation model's ``"last_image"``).
        Evaluations build their requests with it
        (:func:`workbench.inspect.recording.clips.generation_request`).
        """
        if self.card is not None and self.card.serving in IMAGE_MODES:
            return {"image": video[:, :, 0]}
        return {"frames": int(video.shape[2]), "height": int(video.shape[3]), "width": int(video.shape[4])}

    def latent_frames(self, frames: int) -> int:
        """How many latent frames :meth:`encode` makes of ``frames`` pixel frames; ``frames`` by default
        (one latent frame per frame). A video VAE that compresses time overrides it."""
        return int(frames)

    # -- autoencoder -------------------------------------------------------------------------
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] → floating latents ``(B, C, T', H', W')`` on
        :attr:`device`."""
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``(B, C, T', H', W')`` → floating video ``(B, 3, T, H, W)`` in [-1, 1]."""
        raise NotImplementedError

    def preview_decoder(self) -> nn.Module | None:
        """The module :meth:`decode` runs: the first of :attr:`decoder_modules` that is a module, else
        ``None``."""
        for name in self.decoder_modules:
            module = getattr(self, name, None)  # names a subclass may or may not have
            if isinstance(module, nn.Module):
                return module
        return None

    # -- the model ---------------------------------------------------------------------------
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        """The frozen model's prediction at ``x_t`` ``(B, C, T', h, w)``, in ``x_t``'s dtype.

        ``t`` ``(B,)`` is in the objective's units; ``cond`` is a batch's ``cond``. Inside a
        sampler this is the base's part of every composed prediction, so it must be
        deterministic (no dropout: the base is frozen in eval mode) and already satisfy
        :meth:`constrain`.
        """
        raise NotImplementedError

    def constrain(self, prediction: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                  cond: Mapping[str, Any]) -> torch.Tensor:
        """``prediction`` with what the backbone fixes by construction enforced; the identity by default.

        E.g. an image-to-video model whose first frame is given makes every prediction map that
        frame onto its conditioning latent. :class:`ComposedModel` applies it to the composed
        prediction, so what is recorded, recomposed and sampled with is the same tensor. It
        changes only the given frames (``loss_mask`` 0), is idempotent, and leaves
        :meth:`denoise`'s own output unchanged.
        """
        return prediction

    def default_objective(self):
        """The :class:`Objective` this backbone was trained with (used when a config names none).

        Its ``prediction_type`` is the card's.
        """
        raise NotImplementedError

    def callbacks(self) -> tuple:
        """Callbacks this backbone brings to any training run it is part of; none by default."""
        return ()

    def inside_spec(self) -> InsideSpec | None:
        """Where an adapter inside the base (``lora``, ``action_modulation``, ``controlnet``) reaches.

        An :class:`~workbench.core.inside.InsideSpec`: the network every prediction runs through,
        the layers LoRA targets by default, the blocks hooks sit on and their layout. ``None`` (the
        default): such adapters are refused, saying to define this method.
        """
        return None

    # -- memory plans ------------------------------------------------------------------------
    def planning_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """What :meth:`denoise` is called with in a training step on ``latents`` (the clip's native size,
        usually on the meta device): ``(t, cond)``, zeros of the right shapes and dtypes. ``workbench plan``
        traces that call to size a step's activations; the default raises, saying to define this method."""
        raise NotImplementedError(
            f"{type(self).__name__} does not say what its denoiser is called with (planning_inputs), "
            f"so no memory plan can be traced for it. Define planning_inputs(latents) -> (t, cond)."
        )

    def latent_shape(self, clip: ClipSpec) -> tuple[int, ...]:
        """``(C, T', h, w)``: the latents :meth:`encode` makes of one clip of that size. The default encodes
        a zero clip on the meta device; backbones whose encoder cannot run there override it."""
        video = torch.zeros(1, 3, clip.frames, clip.height, clip.width, device="meta")
        return tuple(self.encode(video).shape[1:])

    def frozen_encoders(self) -> tuple[nn.Module, ...]:
        """Frozen encoders this backbone holds outside its submodules (loaded when first needed, e.g.
        conditioning towers): a memory plan counts their weights. None by default."""
        return ()

    def planning_notes(self) -> tuple[str, ...]:
        """What a memory plan of this backbone does not count, in words (e.g. a text encoder the
        configuration leaves out). None by default."""
        return ()

    def weight_files(self) -> tuple[Path, ...]:
        """The files this backbone's frozen weights were read from, every one whose contents decide
        what it computes (a text encoder loaded later included); ``()`` when no file holds them (a
        random init, weights changed in memory after loading). A run records a digest of these files
        as its base, or of the state dict where there are none, and refuses to continue on a base
        whose digest differs (:mod:`workbench.train.provenance`). Default ``()``."""
        return ()

    def predictions_per_step(self, batch: Batch, **sampler_kwargs: Any) -> int:
        """How many times one step of :meth:`generate` calls ``compose_fn`` for ``batch`` with these
        sampler keyword arguments: 1, plus one per guidance branch (classifier-free guidance makes
        two).
        A recording keeps each call's prediction for forks, so :func:`~workbench.inspect.estimate_memory`
        and a ``StoragePolicy(max_bytes=...)`` budget size the replay cache with it. Default 1."""
        return 1

    # -- compilation -------------------------------------------------------------------------
    def compile_target(self) -> nn.Module:
        """The network :meth:`compile` runs through ``torch.compile``: by default the root of
        :meth:`inside_spec` (the network every prediction runs through); a backbone without an
        inside spec overrides this to compile at all."""
        spec = self.inside_spec()
        if spec is None:
            raise CompositionError(
                f"{type(self).__name__} does not say which network to compile: "
                f"compile() compiles the root of its inside_spec() "
                f"(the network every prediction runs through), and its inside_spec() returns None. "
                f"Define inside_spec(), or override compile_target() to return that network."
            )
        return spec.root

    def compile(self, *, backend: str = "inductor", mode: str | None = None, fullgraph: bool = False,
                options: Mapping[str, Any] | None = None) -> BaseVideoModel:
        """Run the denoiser (:meth:`compile_target`) through ``torch.compile``; returns ``self``.

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
            net = self.compile_target()
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

    # -- placement ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the backbone's first parameter lives (CPU without parameters)."""
        p = _first_parameter(self)
        return p.device if p is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the backbone computes in: its first parameter's outside :meth:`keep_in_float32`
        (float32 without parameters)."""
        kept = self._float32_paths()
        if not kept:
            p = _first_parameter(self)
            return p.dtype if p is not None else torch.float32
        for name, p in self.named_parameters():
            if not kept or not _under(name, kept):
                return p.dtype
        return torch.float32

    def keep_in_float32(self) -> tuple[str, ...]:
        """Dotted paths of the submodules (or single parameters) that stay float32 whatever dtype
        the backbone is moved to; none by default.

        Layers that compute in float32 (a norm upcasting its input, a VAE upstream runs in
        float32) keep their weights in float32, as diffusers' ``_keep_in_fp32_modules`` does at
        load time: ``base.to(torch.bfloat16)`` moves them to the new device, not to the new dtype,
        so a backbone moved to bf16 is the one a bf16 load makes.
        """
        return ()

    def _float32_paths(self) -> tuple[str, ...]:
        cached = self.__dict__.get("_float32_cache")
        if cached is None:
            cached = tuple(self.keep_in_float32())
            if cached:  # (a backbone still being built may not have its modules yet: ask again next time)
                self.__dict__["_float32_cache"] = cached
        return cached

    def _apply(self, fn, recurse=True):
        kept = self._float32_paths()
        if not kept:
            return super()._apply(fn, recurse)
        ids = set()
        for name, t in (*self.named_parameters(), *self.named_buffers()):
            if _under(name, kept):
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


def _under(name: str, paths: tuple[str, ...]) -> bool:
    """``name`` (a dotted parameter path) is one of ``paths`` or lies inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in paths)


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


#: The methods every backbone implements; the rest of :class:`BaseVideoModel` has a default (the table in
#: docs/guides/writing-a-backbone.md, "The required part", with the card). ``example_batch`` is required too,
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
