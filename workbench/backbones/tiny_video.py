"""``tiny_video``: the embedded default backbone, a small latent image-to-video model.

Two parts, like the real backbones:

* a per-frame convolutional autoencoder (``encode`` / ``decode``), 64×64×3 → 16×16×4 latents
  by default, with a fixed latent normalisation stored next to the weights;
* a (2+1)-D convolutional U-Net denoiser over latent clips ``(B, C, T, h, w)``, conditioned on
  the first frame's latent (concatenated to every frame) and on the noise level.

The two networks are in :mod:`workbench.backbones.tiny_video_networks`; this module is the
backbone around them: its config, conditions, samplers and weights.

It trains as flow matching (Euler sampler, optional timestep shift) or as diffusion (DDIM).
Image-to-video is exact: the first frame follows the exact noising path of its latent at every
step, so ``decode(generate(...))[:, :, 0]`` is the decoded conditioning frame.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from workbench.backbones.random_weights import keeping_meta
from workbench.backbones.tiny_video_networks import Denoiser, FrameAutoencoder, per_frame
from workbench.config import check, check_compile
from workbench.core.backbone import (
    CONTROL_KEY,
    BaseVideoModel,
    StepRecord,
    as_video,
    control_video,
    example_inputs,
)
from workbench.core.capabilities import CachesLatents, GivenFrames, InsideAccess, LatentLayout, MemoryPlanning
from workbench.core.card import ClipSpec, ComponentSpec, ModelCard, RecipeSpec, SamplingDefaults
from workbench.core.conditions import Batch
from workbench.core.inside import InsideSpec
from workbench.core.objectives import Diffusion, FlowMatching
from workbench.core.platform import is_device_name, placement
from workbench.errors import CheckpointError, DataError
from workbench.registry import register

WEIGHTS_DIR = Path(__file__).parent / "weights"
PER_FRAME_KEYS = ("action", "proprio", "ee_pos")
#: Per-clip vectors passed through as conditions: the camera's calibration (see workbench.data.camera).
PER_CLIP_KEYS = ("camera",)
#: The widths the example batch gives each signal (any width passes through).
EXAMPLE_WIDTHS = {"action": 4, "proprio": 3, "ee_pos": 3, "camera": 12}
PRECISION = {"cpu": "float32", "cuda": "float32", "mps": "float32"}
# how this model is loaded and run, not what it is
PLACEMENT_FIELDS = ("weights", "device", "dtype", "compile")


@dataclass
class TinyVideoConfig:
    """Architecture and sampling settings of ``tiny_video``.

    ``weights``: ``None`` (random init), ``"pretrained"`` (the weights shipped with
    workbench), or a path to a ``.safetensors`` file saved by :meth:`TinyVideo.save_pretrained`.
    The defaults are the shipped weights' architecture (64×64, 16 frames at 40 fps), so
    ``TinyVideoConfig(weights="pretrained")`` — ``{weights: pretrained}`` in YAML — just works.
    ``device`` / ``dtype``: where and in what the weights load (``auto``: the best visible device,
    in the card's precision for it — float32 everywhere for this model; see
    :mod:`workbench.core.platform`). ``compile``: run the denoiser through ``torch.compile``
    (:meth:`~workbench.core.backbone.BaseVideoModel.compile`). None of the three is part of the
    architecture saved with the weights.
    """

    image_size: int = 64
    frames: int = 16
    latent_channels: int = 4
    ae_width: int = 32
    downsample: Literal[1, 2, 4, 8] = 4
    width: int = 32
    depth: int = 2
    objective: Literal["flow_matching", "diffusion"] = "flow_matching"
    prediction: Literal["eps", "v", "x0"] = "eps"
    shift: float = 1.0
    sampling_steps: int = 20
    dropout: float = 0.0
    fps: int = 40
    weights: str | None = None
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False

    def __post_init__(self):
        check_compile(self.compile)
        check(self.image_size % self.downsample == 0, "image_size",
              f"must be divisible by downsample={self.downsample}, got {self.image_size}.")
        check(self.frames >= 2, "frames", f"must be >= 2, got {self.frames}.")
        check(self.latent_channels >= 1, "latent_channels", f"must be >= 1, got {self.latent_channels}.")
        check(self.width >= 8 and self.width % 8 == 0, "width", f"must be a multiple of 8, got {self.width}.")
        check(self.ae_width >= 8 and self.ae_width % 8 == 0, "ae_width",
              f"must be a multiple of 8, got {self.ae_width}.")
        check(self.depth >= 1, "depth", f"must be >= 1, got {self.depth}.")
        check(self.sampling_steps >= 1, "sampling_steps", f"must be >= 1, got {self.sampling_steps}.")
        check(self.shift > 0, "shift", f"must be > 0, got {self.shift}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")
        check(is_device_name(self.device), "device",
              f"must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}.")


@register("backbone", "tiny_video")
class TinyVideo(BaseVideoModel, GivenFrames, LatentLayout, CachesLatents, InsideAccess, MemoryPlanning):
    """The embedded image-to-video backbone (see the module docstring).

    Examples:
        >>> base = TinyVideo(TinyVideoConfig(image_size=16, frames=4, width=16, ae_width=8))
        >>> batch = base.prepare_batch({"video": torch.rand(2, 3, 4, 16, 16) * 2 - 1})
        >>> tuple(batch.latents.shape)               # (B, C, T, h, w)
        (2, 4, 4, 4, 4)
    """

    config_class = TinyVideoConfig
    decodes_frames_alone = True  # a per-frame autoencoder (tests/test_tiny_video_autoencoder.py)

    def __init__(self, config: TinyVideoConfig | None = None, **overrides):
        super().__init__()
        self.config = config = self.config_from(config, overrides)
        device, dtype = placement(config.device, config.dtype, PRECISION, where="tiny_video")
        # Saved weights load straight onto the device, in the dtype (no random init to overwrite);
        # a random init is drawn on the CPU, so a seed means the same weights on every machine; a memory
        # plan's build (weights_on_meta) keeps its random init on the meta device, sizes without storage.
        on_meta = config.weights is None and keeping_meta()
        with torch.device("meta" if config.weights is not None or on_meta else "cpu"):
            self.autoencoder = FrameAutoencoder(config.latent_channels, config.ae_width, config.downsample)
            self.denoiser = Denoiser(config.latent_channels, config.width, config.depth, config.dropout)
            self.register_buffer("latent_mean", torch.zeros(config.latent_channels))
            self.register_buffer("latent_std", torch.ones(config.latent_channels))
        self.provenance: dict[str, Any] = {}
        self._weights_file: Path | None = None  # what load_weights read
        self._objective = (FlowMatching(shift=config.shift) if config.objective == "flow_matching"
                           else Diffusion(prediction=config.prediction))
        if config.weights is not None:
            self.load_weights(config.weights, device=device, dtype=dtype)
        else:
            self.to(dtype=dtype) if on_meta else self.to(device=device, dtype=dtype)
        self.card = self.make_card()
        if config.compile:
            self.compile()

    @classmethod
    def from_config(cls, config: TinyVideoConfig) -> TinyVideo:
        return cls(config)

    @classmethod
    def from_pretrained(cls, path: str | Path = "pretrained", *, device: str = "auto",
                        dtype: str = "auto") -> TinyVideo:
        """Load weights and architecture saved by :meth:`save_pretrained` (or the shipped ones).

        The weights load directly onto ``device`` in ``dtype`` (``auto``: see :class:`TinyVideoConfig`).
        """
        meta = _read_meta(_weights_path(path))
        arch = {k: v for k, v in meta["config"].items() if k not in PLACEMENT_FIELDS}
        return cls(TinyVideoConfig(**arch, weights=str(path), device=device, dtype=dtype))

    # -- card --------------------------------------------------------------------------------
    def make_card(self) -> ModelCard:
        """The card this backbone's config and :attr:`provenance` describe: ``card`` is made so at init;
        after the provenance changes (pretraining records what the weights were trained on) this is the
        card that matches."""
        c = self.config
        source = self.provenance.get("source", "random")
        flow = c.objective == "flow_matching"
        recipe = RecipeSpec(
            method="pretrain_i2v" if source != "random" else "random_init",
            trained_on=self.provenance.get("trained_on", ""),
            train_steps=self.provenance.get("train_steps"),
            val_loss=self.provenance.get("val_loss"),
        )
        n_den = sum(p.numel() for p in self.denoiser.parameters())
        n_ae = sum(p.numel() for p in self.autoencoder.parameters())
        dtype = str(self.dtype).replace("torch.", "")
        return ModelCard(
            model_id=self.provenance.get("model_id", f"tiny_video-{c.objective}"),
            family="tiny_video",
            prediction_type="velocity" if flow else c.prediction,
            components={"denoiser": ComponentSpec("denoiser", source, dtype, n_den),
                        "vae": ComponentSpec("vae", source, dtype, n_ae)},
            sampling=SamplingDefaults(steps=c.sampling_steps, sampler="euler" if flow else "ddim",
                                      height=c.image_size, width=c.image_size, num_frames=c.frames, fps=c.fps,
                                      shift=c.shift if flow else None),
            precision=dict(PRECISION),
            capabilities=("i2v",),
            recipe=recipe,
            samplers=("euler",) if flow else ("ddim",),
            notes="Per-frame conv autoencoder + (2+1)-D conv U-Net; first-frame (i2v) conditioning.",
        )

    def default_objective(self):
        return self._objective

    def provides(self) -> tuple[str, ...]:
        return ("first_frame", *PER_FRAME_KEYS, *PER_CLIP_KEYS, CONTROL_KEY)

    def example_batch(self, batch_size: int = 2, *,
                      generator: torch.Generator | None = None) -> dict[str, Any]:
        """Video, the per-frame signals, the camera vector and a one-channel control video, at the
        clip's size.

        Examples:
            >>> raw = TinyVideo(image_size=16, frames=4, width=16, ae_width=8, depth=1).example_batch()
            >>> sorted(raw), tuple(raw["video"].shape)
            (['action', 'camera', 'control', 'ee_pos', 'proprio', 'video'], (2, 3, 4, 16, 16))
        """
        return example_inputs(self.clip(), batch_size, generator=generator,
                              per_frame={k: EXAMPLE_WIDTHS[k] for k in PER_FRAME_KEYS},
                              per_clip={k: EXAMPLE_WIDTHS[k] for k in PER_CLIP_KEYS})

    # -- autoencoder -------------------------------------------------------------------------
    def _norm(self, z: torch.Tensor) -> torch.Tensor:
        view = (1, -1) + (1,) * (z.ndim - 2)
        return (z - self.latent_mean.view(view)) / self.latent_std.view(view)

    def _denorm(self, z: torch.Tensor) -> torch.Tensor:
        view = (1, -1) + (1,) * (z.ndim - 2)
        return z * self.latent_std.view(view) + self.latent_mean.view(view)

    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """``(N, 3, H, W)`` → normalised latents ``(N, C, h, w)``."""
        return self._norm(per_frame(self.autoencoder.encoder, frames))

    def decode_frames(self, latents: torch.Tensor) -> torch.Tensor:
        return per_frame(self.autoencoder.decoder, self._denorm(latents)).clamp(-1, 1)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        b, _, t, h, w = video.shape
        # any float video, our dtype
        frames = video.to(self.dtype).permute(0, 2, 1, 3, 4).reshape(b * t, 3, h, w)
        z = self.encode_frames(frames)
        return z.view(b, t, *z.shape[1:]).permute(0, 2, 1, 3, 4)  # (B, C, T, h, w)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = latents.shape
        frames = self.decode_frames(latents.to(self.dtype).permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        return frames.view(b, t, *frames.shape[1:]).permute(0, 2, 1, 3, 4)  # (B, 3, T, H, W)

    # -- batches -----------------------------------------------------------------------------
    def prepare_batch(self, raw: Mapping[str, Any] | Batch) -> Batch:
        """Raw data → :class:`Batch`.

        ``raw`` holds ``"video"`` ``(B, 3, T, H, W)`` in [-1, 1] (or uint8 ``(B, T, H, W, 3)``) for
        training and evaluation — or ``"latents"`` ``(B, C, T, h, w)``, the video already encoded
        by :meth:`encode` (see :meth:`encode_item`) — or only ``"image"`` ``(B, 3, H, W)`` (the
        first frame) for generation. Per-frame ``"action"`` / ``"actions"``, ``"proprio"``, ``"ee_pos"``
        ``(B, T, D)`` pass through as conditions, so does the per-clip ``"camera"`` ``(B, 12)`` (the
        calibration, see :mod:`workbench.data.camera`) and a control video ``"control"``
        ``(B, C, T, H, W)`` (see :func:`~workbench.core.backbone.control_video`).
        """
        if isinstance(raw, Batch):
            return raw
        if not isinstance(raw, Mapping):
            raise DataError(f"prepare_batch expects a mapping of tensors, got {type(raw).__name__}.")
        self.card.check_request(raw, backbone="tiny_video",
                                fix="tiny_video conditions on the first frame only "
                                    "('image' or the first frame of 'video'); "
                                    "a text-conditioned backbone such as wan22_ti2v reads prompts.")
        device = self.device
        with torch.no_grad():
            if "latents" in raw:
                latents = self._check_latents(raw["latents"]).to(device)
                video, frames, has_target = None, latents.shape[2], True
            elif "video" in raw:
                video = as_video(raw["video"], "video").to(device=device, dtype=self.dtype)
                frames = video.shape[2]
                has_target = True
            elif "image" in raw:
                image = torch.as_tensor(raw["image"]).to(device=device, dtype=self.dtype)
                if image.ndim != 4 or image.shape[1] != 3:
                    raise DataError(f"'image' must be (B, 3, H, W) in [-1, 1], got {tuple(image.shape)}.")
                frames = self._frames_from(raw)
                video = image[:, :, None].expand(-1, -1, frames, -1, -1)
                has_target = False
                if frames > 2:  # every frame is the image: encode it once, beside a copy (a batch of one
                    # frame convolves with other kernels and rounds differently), and repeat its latent
                    self._check_size(video)
                    once = self.encode(video[:, :, :2])[:, :, :1]
                    latents = once.expand(-1, -1, frames, -1, -1).contiguous()
                    video = None
            else:
                raise DataError(
                    f"prepare_batch needs 'video' (B, 3, T, H, W), 'latents' (B, C, T, h, w) or 'image' "
                    f"(B, 3, H, W); got keys {sorted(raw)}."
                )
            if video is not None:
                self._check_size(video)
                latents = self.encode(video)
        cond: dict[str, Any] = {"first_frame": latents[:, :, 0]}
        for key in PER_FRAME_KEYS:
            value = raw.get(key, raw.get("actions") if key == "action" else None)
            if value is None:
                continue
            value = torch.as_tensor(value, device=device)
            if value.ndim != 3 or value.shape[0] != latents.shape[0] or value.shape[1] != frames:
                raise DataError(
                    f"'{key}' must be (B, T, D) with B={latents.shape[0]} and T={frames} frames, got "
                    f"{tuple(value.shape)}."
                )
            cond[key] = value.float()
        for key in PER_CLIP_KEYS:
            if raw.get(key) is None:
                continue
            value = torch.as_tensor(raw[key], device=device)
            if value.ndim != 2 or value.shape[0] != latents.shape[0]:
                raise DataError(f"'{key}' must be (B, D) with B={latents.shape[0]} (one vector per clip), "
                                f"got {tuple(value.shape)}.")
            cond[key] = value.float()
        control = control_video(raw, batch_size=latents.shape[0], frames=frames, device=device,
                                backbone="tiny_video")
        if control is not None:
            cond[CONTROL_KEY] = control
        mask = torch.ones(latents.shape[0], frames, device=device)
        mask[:, 0] = 0  # the first frame is given, not predicted
        return Batch(latents=latents, cond=cond, loss_mask=mask,
                     per_frame=frozenset(k for k in PER_FRAME_KEYS if k in cond),
                     meta={"has_target": has_target})

    def _check_latents(self, value: Any) -> torch.Tensor:
        latents = torch.as_tensor(value)
        c = self.config
        want = (c.latent_channels, c.image_size // c.downsample, c.image_size // c.downsample)
        if (latents.ndim != 5 or (latents.shape[1], *latents.shape[3:]) != want
                or not latents.is_floating_point()):
            raise DataError(
                f"'latents' must be float (B, {want[0]}, T, {want[1]}, {want[2]}) "
                f"as tiny_video.encode returns, got {tuple(latents.shape)} {latents.dtype}. "
                f"Pass 'video' instead to have them encoded."
            )
        return latents.to(self.dtype)

    def _check_size(self, video: torch.Tensor) -> None:
        """Frames of another size than the model's are refused before they are encoded, in the
        data's terms."""
        size = self.config.image_size
        height, width = video.shape[-2:]
        if (height, width) != (size, size):
            weights = (f" (its weights {self.config.weights!r} were trained at that size)"
                       if self.config.weights else "")
            raise DataError(
                f"tiny_video was built for {size}x{size} frames{weights}, "
                f"but the data serves {height}x{width}. Set the dataset's size: [{size}, {size}] "
                f"(the lerobot dataset resizes its frames; `workbench data import --size {size} {size}` "
                f"stores them so), or build the backbone with image_size: {width} "
                f"(a model of its own, without these weights).")

    def encode_item(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """A dataset item with ``"video"`` (``(3, T, H, W)`` or uint8 ``(T, H, W, 3)``) replaced by
        its latents."""
        if "video" not in item:
            return None
        video = as_video(torch.as_tensor(item["video"])[None], "video").to(device=self.device,
                                                                          dtype=self.dtype)
        self._check_size(video)
        with torch.no_grad():
            latents = self.encode(video)[0].cpu()  # (C, T, h, w)
        return {**{k: v for k, v in item.items() if k != "video"}, "latents": latents}

    def _frames_from(self, raw: Mapping[str, Any]) -> int:
        for key in ("action", "actions", *PER_FRAME_KEYS):
            if raw.get(key) is not None:
                return int(torch.as_tensor(raw[key]).shape[1])
        if raw.get(CONTROL_KEY) is not None:
            return int(torch.as_tensor(raw[CONTROL_KEY]).shape[2])
        return int(raw.get("frames", self.config.frames))

    # -- denoising ---------------------------------------------------------------------------
    def pin_first_frame(self, pred: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                        cond: Mapping[str, Any]) -> torch.Tensor:
        z0 = cond["first_frame"]
        pinned = pred.clone()
        # the prediction that maps frame 0 of x_t exactly onto the conditioning latent
        pinned[:, :, 0] = self._objective.prediction_from_x0(z0, x_t[:, :, 0], t)
        return pinned

    def constrain(self, prediction: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                  cond: Mapping[str, Any]) -> torch.Tensor:
        return self.pin_first_frame(prediction, x_t, t, cond)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        if "first_frame" not in cond:
            raise DataError("tiny_video.denoise needs cond['first_frame'] (B, C, h, w) from prepare_batch.")
        t = torch.as_tensor(t, device=x_t.device)
        t = t.expand(x_t.shape[0]) if t.ndim == 0 else t
        level = self._objective.noise_level(t)
        pred = self.denoiser(x_t, level, cond["first_frame"].to(x_t.dtype))
        return self.pin_first_frame(pred, x_t, t, cond)

    def planning_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(t, cond)`` of the shapes :meth:`denoise` takes for ``latents`` (zeros on their device): a
        time per clip and the first frame's latent. For memory plans."""
        t = torch.full((latents.shape[0],), 0.5, device=latents.device, dtype=latents.dtype)
        return t, {"first_frame": torch.zeros_like(latents[:, :, 0])}

    def latent_shape(self, clip: ClipSpec) -> tuple[int, ...]:
        """``(C, T, h, w)``: the autoencoder encodes each frame on its own, ``downsample`` times smaller."""
        d = self.config.downsample
        return (self.config.latent_channels, clip.frames, clip.height // d, clip.width // d)

    def inside_spec(self) -> InsideSpec:
        """Adapters inside the base reach into the denoiser: LoRA on its convolutions and linears,
        hooks on its down, middle and up blocks (``(B, W, T, h, w)``); the down blocks are the chain
        a ControlNet copies."""
        den = self.denoiser
        blocks = (*den.down_blocks, *den.mid_blocks, *den.up_blocks)
        return InsideSpec(root=den, root_name="denoiser",
                          lora_targets=("spatial", "temporal", "film", "down", "up", "merge", "out"),
                          blocks=blocks,
                          widths=tuple(b.norm1.num_channels for b in blocks),  # LoRA may wrap convs
                          branch_blocks=len(den.down_blocks), layout="channels")

    # -- native samplers ---------------------------------------------------------------------
    def schedule(self, steps: int) -> torch.Tensor:
        """The ``steps + 1`` times the native sampler visits (objective units)."""
        return self._objective.sampling_times(steps)

    def run_sampler(self, batch, *, steps, sampler, generator, compose_fn, on_step, initial_noise=None):
        shape = batch.latents.shape
        x = initial_noise if initial_noise is not None else torch.randn(
            shape, generator=generator, device=batch.latents.device, dtype=batch.latents.dtype)
        times_host = self.schedule(steps)
        times = times_host.to(x.device)
        obj = self._objective
        for i in range(steps):
            t = times[i].expand(shape[0])
            pred = self.pin_first_frame(compose_fn(x, t, batch), x, t, batch.cond)
            if sampler == "euler":
                x_next = x + (times[i + 1] - times[i]).to(x.dtype) * pred
            else:  # ddim, eta = 0
                x0 = obj.x0_from_prediction(pred, x, t)
                a, s = (c.to(x.dtype).view(-1, 1, 1, 1, 1) for c in obj.coefficients(t))
                eps = (x - a * x0) / s
                if times_host[i + 1] < 0:
                    x_next = x0
                else:
                    a_n, s_n = (c.to(x.dtype).view(-1, 1, 1, 1, 1)
                                for c in obj.coefficients(times[i + 1].expand(shape[0])))
                    x_next = a_n * x0 + s_n * eps
            if on_step is not None:
                on_step(StepRecord(i, steps, t, x, pred, x_next))
            x = x_next
        x = x.clone()
        x[:, :, 0] = batch.cond["first_frame"]
        return x

    # -- weights -----------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path, **provenance) -> Path:
        """Write weights (safetensors) with the architecture and provenance in its metadata."""
        from dataclasses import asdict

        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in asdict(self.config).items() if k not in PLACEMENT_FIELDS}
        meta = {"config": config, "provenance": {**self.provenance, **provenance}}
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path), metadata={"workbench": json.dumps(meta)})
        return path

    def load_weights(self, path: str | Path, *, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None) -> None:
        """Load weights saved by :meth:`save_pretrained` into this model (same architecture).

        With ``device`` / ``dtype`` the tensors are read onto that device and cast once, and the
        module takes them as they are (it may have been built on the ``meta`` device).
        """
        from safetensors.torch import load_file

        file = _weights_path(path)
        meta = _read_meta(file)
        ours = {k: v for k, v in vars(self.config).items() if k not in PLACEMENT_FIELDS}
        theirs = {k: v for k, v in meta["config"].items() if k not in PLACEMENT_FIELDS}
        diff = {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs)
                if ours.get(k) != theirs.get(k)}
        if diff:
            raise CheckpointError(
                f"Weights {file} were saved for a different tiny_video architecture: "
                + ", ".join(f"{k}: built {a!r}, weights {b!r}" for k, (a, b) in sorted(diff.items()))
                + ". Build with TinyVideo.from_pretrained(path) to take the saved architecture, "
                "or in a config give it with the weights: "
                f"base: {{type: tiny_video, config: {{weights: {path}, "
                + ", ".join(f"{k}: {b}" for k, (_, b) in sorted(diff.items())) + "}}."
            )
        target = device if device is not None else self.device
        state = load_file(str(file), device=str(target))
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        missing, unexpected = self.load_state_dict(state, strict=False, assign=device is not None)
        if missing or unexpected:
            raise CheckpointError(f"Weights {file} do not fit tiny_video: missing {missing}, "
                                  f"unexpected {unexpected}.")
        self.provenance = {**meta.get("provenance", {}), "source": str(path)}
        self._weights_file = file

    def weight_files(self) -> tuple[Path, ...]:
        """The ``.safetensors`` file the weights were loaded from (``()`` for a random init)."""
        return (self._weights_file,) if self._weights_file is not None else ()


def _weights_path(path: str | Path) -> Path:
    if str(path) == "pretrained":
        file = WEIGHTS_DIR / "tiny_video.safetensors"
        if not file.exists():
            raise CheckpointError(
                f"The shipped tiny_video weights are missing ({file}). Reinstall workbench, or train "
                f"them with `workbench pretrain`."
            )
        return file
    file = Path(path)
    if not file.exists():
        raise CheckpointError(f"tiny_video weights not found at {file}. Expected a .safetensors file "
                              f"written by TinyVideo.save_pretrained (or weights='pretrained').")
    return file


def _read_meta(file: Path) -> dict:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            raw = (f.metadata() or {}).get("workbench")
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"Cannot read tiny_video weights {file}: {err}. The file is not a valid "
                              f"safetensors file; re-save or re-download it.") from err
    if raw is None:
        raise CheckpointError(f"{file} has no workbench metadata; "
                              f"save weights with TinyVideo.save_pretrained.")
    return json.loads(raw)
