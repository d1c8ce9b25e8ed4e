"""``dynamicrafter``: DynamiCrafter (image → video latent diffusion) as a frozen workbench backbone.

Loads an official checkpoint (``Doubiiu/DynamiCrafter``, ``_512``, ``_1024``, ``_512_Interp``:
``model.ckpt`` read with ``weights_only=True``, or a ``.safetensors`` conversion) into this
package's own implementation, and samples with its own DDIM loop (see ``sampling``), the adapter
injected at the one place every prediction is made: each guidance branch's U-Net call goes
through ``compose_fn`` with that branch's conditions (the unconditional branches see the
adapter's signals zeroed, which is what condition dropout shows it in training).

Conditions (``prepare_batch``): ``context`` (77 text tokens + 16 image tokens per frame),
``concat`` (the first frame's latent on every frame; first and last frame only for
``512_interp``), ``fs`` (frame stride or fps), ``first_frame``, and per-frame signals
(``action``, ``proprio``, ``ee_pos``). Time is the training timestep ``t`` in ``[0, 1000)``; the
objective is :class:`~workbench_dynamicrafter.sampling.DynamiCrafterDiffusion`.

The backbone holds the U-Net and the VAE; the conditioning towers (the CLIP text and vision towers
and the resampler) load from the same checkpoint when first needed (:attr:`DynamiCrafter.conditioning`)
and are not submodules, so a run fed its conditions from a latent cache (:meth:`encode_item`: the
clip's latents and its text + image context) never loads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from workbench import BaseVideoModel, Batch, ComponentSpec, InsideSpec, ModelCard, SamplingDefaults
from workbench.backbones.diffusers_bridge import (
    CONTROL_KEY,
    SIGNAL_KEYS,
    add_signals,
    as_video,
    example_inputs,
    placement,
    prompts_from,
    requested_frames,
)
from workbench.config import check, check_compile
from workbench.core.capabilities import (
    CachesLatents,
    InsideAccess,
    KeepsFloat32,
    MemoryPlanning,
    SamplingOptions,
)
from workbench.errors import CheckpointError, DataError
from workbench_dynamicrafter.sampling import DDIMTables, DynamiCrafterDiffusion, ddim_loop
from workbench_dynamicrafter.unet import stage_width
from workbench_dynamicrafter.variants import VARIANTS


@dataclass
class DynamiCrafterConfig:
    """How to load and drive DynamiCrafter.

    ``path``: an official checkpoint (``model.ckpt`` / ``.safetensors``), ``"tiny"`` for a tiny
    random model built once under the workbench cache, or ``"real"`` for the released sizes shipped
    with the plugin (``real/<variant>.json``; no weights: needs ``random_weights``).
    ``random_weights``: build the architecture with random weights instead of reading a checkpoint
    (``path`` ``tiny`` or ``real``), each tensor materialised once in the target dtype; ``seed`` picks them.
    ``variant``: ``256`` / ``512`` / ``1024`` / ``512_interp``; ``None`` recognises it from the checkpoint
    (``512_interp`` must be named).
    ``sizes``: size overrides (``Sizes`` fields) for a checkpoint of non-released sizes, e.g. one
    written by ``workbench_dynamicrafter.tiny``. ``dtype``: ``auto`` = bf16 on a GPU, float32 on CPU.
    ``tokenizer``: a transformers ``CLIPTokenizer`` directory or hub id (OpenAI CLIP's BPE, the one
    open_clip uses).
    ``prompt_key`` / ``prompt_template`` / ``prompt``: the text condition (as in the other plugins).
    ``steps`` / ``guidance_scale`` / ``image_guidance_scale`` / ``guidance_rescale`` / ``eta`` /
    ``spacing`` / ``fs`` / ``height`` / ``width`` / ``num_frames``: sampling defaults; ``None`` keeps
    the variant's release settings. ``image_guidance_scale`` switches on the multi-condition CFG.
    ``compile``: run the U-Net through ``torch.compile`` (:meth:`~workbench.BaseVideoModel.compile`).
    """

    path: str
    variant: Literal["256", "512", "1024", "512_interp"] | None = None
    sizes: dict[str, Any] | None = None
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    random_weights: bool = False
    seed: int = 0
    tokenizer: str = "openai/clip-vit-large-patch14"
    prompt_key: str = "prompt"
    prompt_template: str = "{}"
    prompt: str | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    image_guidance_scale: float | None = None
    guidance_rescale: float | None = None
    eta: float | None = None
    spacing: Literal["uniform", "uniform_trailing"] | None = None
    fs: int | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    compile: bool = False

    def __post_init__(self):
        check_compile(self.compile)
        check(bool(self.path), "path",
              "is empty; give a DynamiCrafter checkpoint (model.ckpt / .safetensors) or 'tiny'.")
        check("{}" in self.prompt_template, "prompt_template",
              f"must contain '{{}}' where the batch's prompt goes, got {self.prompt_template!r}.")
        check(self.variant is None or str(self.variant) in VARIANTS, "variant",
              f"must be one of {', '.join(VARIANTS)} or null, got {self.variant!r}.")
        check(self.steps is None or self.steps >= 1, "steps", f"must be >= 1 or null, got {self.steps}.")
        check(self.eta is None or self.eta >= 0, "eta", f"must be >= 0 or null, got {self.eta}.")
        for name in ("fs", "height", "width", "num_frames"):
            value = getattr(self, name)
            check(value is None or value >= 1, name, f"must be a positive int or null, got {value}.")


#: The weights' dtype per device type (``dtype: auto``): what the released model was trained in on a GPU.
PRECISION = {"cpu": "float32", "cuda": "bfloat16"}


class DynamiCrafter(BaseVideoModel, SamplingOptions, CachesLatents, MemoryPlanning, KeepsFloat32,
                    InsideAccess):
    """DynamiCrafter (first frame + text → video) as a frozen backbone.

    >>> base = DynamiCrafter(path="/models/DynamiCrafter_512/model.ckpt")       # variant from the keys
    >>> batch = base.prepare_batch({"video": clips, "prompt": "a robot arm pushes a puck", "action": actions})
    >>> latents = base.generate({"image": first_frames, "prompt": "...", "frames": 16})
    """

    config_class = DynamiCrafterConfig
    sampler_inputs = ("image",)  # the first frame's pixels, kept beside the conditions made from them

    def __init__(self, config: DynamiCrafterConfig | None = None, **overrides):
        super().__init__()
        from workbench_dynamicrafter.model import from_checkpoint

        self.config = config = self.config_from(config, overrides)
        device, dtype = placement(config.device, config.dtype, PRECISION, where="dynamicrafter config")
        variant = None if config.variant is None else str(config.variant)
        if config.random_weights:
            from workbench_dynamicrafter.model import random_model, real_configuration

            if config.path == "real":
                variant, sizes = real_configuration(variant or "512")
                sizes = {**sizes, **(config.sizes or {})}
                self.source = f"random weights (seed {config.seed}) on the released {variant} configuration"
            elif config.path == "tiny":
                from workbench_dynamicrafter.tiny import TINY_SIZES

                variant, sizes = variant or "512", {**TINY_SIZES, **(config.sizes or {})}
                self.source = f"random weights (seed {config.seed}) on the tiny configuration"
            else:  # a checkpoint's architecture is the released one of its variant
                variant, sizes = real_configuration(variant or "512")
                sizes = {**sizes, **(config.sizes or {})}
                self.source = (f"random weights (seed {config.seed}) on the released {variant} configuration "
                               f"(the architecture of {config.path}; its weights are not read)")
            self.model = random_model(variant, device=device, dtype=dtype, parts=("unet", "vae"),
                                      seed=config.seed, **sizes)
            self.__dict__["_checkpoint"] = (None, variant, sizes)
        elif config.path == "real":
            raise CheckpointError("dynamicrafter: path 'real' is the released sizes without weights. Set "
                                  "random_weights: true to build them with random weights, "
                                  "or point path at a checkpoint (Doubiiu/DynamiCrafter_512's model.ckpt).")
        else:
            if config.path == "tiny":
                from workbench_dynamicrafter.tiny import TINY_SIZES, ensure_tiny_checkpoint

                file, variant = ensure_tiny_checkpoint(variant or "512"), variant or "512"
                sizes = {**TINY_SIZES, **(config.sizes or {})}
                self.source = "tiny random model"
            else:
                file, sizes = config.path, dict(config.sizes or {})
                self.source = str(config.path)
            self.model = from_checkpoint(file, variant, device=device, dtype=dtype, parts=("unet", "vae"),
                                         **sizes)
            # where the towers load from
            self.__dict__["_checkpoint"] = (file, self.model.variant.name, sizes)
        self.variant = self.model.variant
        self.__dict__["_conditioning"] = None
        self._objective = DynamiCrafterDiffusion(self.variant)
        self._text_cache: dict[str, torch.Tensor] = {}
        self._zero_image_cache: dict[tuple, torch.Tensor] = {}
        self._tokenizer = None
        self.card = self._make_card(dtype)
        if config.compile:
            self.compile()

    @classmethod
    def from_config(cls, config: DynamiCrafterConfig) -> DynamiCrafter:
        return cls(config)

    @classmethod
    def from_checkpoint(cls, path: str | Path, variant: str | None = None, **overrides) -> DynamiCrafter:
        """Load an official checkpoint; ``overrides``: :class:`DynamiCrafterConfig` fields."""
        return cls(DynamiCrafterConfig(path=str(path), variant=variant, **overrides))

    # -- card --------------------------------------------------------------------------------
    def recipe(self) -> dict[str, Any]:
        """The sampling settings in force: the variant's release settings unless the config overrides them."""
        v, c = self.variant, self.config
        pick = lambda name, default: default if getattr(c, name) is None else getattr(c, name)  # noqa: E731
        return dict(steps=pick("steps", v.steps), guidance_scale=pick("guidance_scale", v.guidance_scale),
                    image_guidance_scale=c.image_guidance_scale,
                    guidance_rescale=pick("guidance_rescale", v.guidance_rescale), eta=pick("eta", v.eta),
                    spacing=pick("spacing", v.spacing), fs=pick("fs", v.fs), height=pick("height", v.height),
                    width=pick("width", v.width), num_frames=pick("num_frames", v.frames))

    def _make_card(self, dtype: torch.dtype) -> ModelCard:
        v, r = self.variant, self.recipe()
        counts = self.model.parameter_counts()
        weights = str(dtype).replace("torch.", "")

        def spec(kind: str, name: str | None) -> ComponentSpec:
            return ComponentSpec(kind, self.source, weights if name else None, counts[name] if name else None)

        return ModelCard(
            model_id=f"dynamicrafter-{v.name}:{Path(self.source).name}",
            family="dynamicrafter",
            prediction_type=v.prediction,
            components={"unet": spec("denoiser", "unet"), "vae": spec("vae", "vae"),
                        "text_encoder": spec("text_encoder", "text"),
                        "image_encoder": spec("image_encoder", "vision"),
                        "resampler": spec("other", "resampler"), "tokenizer": spec("tokenizer", None),
                        "scheduler": spec("scheduler", None)},
            sampling=SamplingDefaults(steps=r["steps"], sampler="ddim", guidance_scale=r["guidance_scale"],
                                      height=r["height"], width=r["width"], num_frames=r["num_frames"],
                                      fps=r["fs"] if v.fs_kind == "fps" else None),
            precision=dict(PRECISION),
            capabilities=("i2v", "ti2v"),
            mode="ti2v",
            samplers=("ddim",),
            # the interpolation model also needs the clip's last frame, a frame a rollout does not know yet
            context_frames=0 if v.interp else 1,
            notes=f"DynamiCrafter {v.name}: {v.prediction}-prediction, "
                  f"{'zero-terminal-SNR, ' if v.zero_snr else ''}DDIM {r['spacing']} eta {r['eta']}, "
                  f"guidance {r['guidance_scale']} (rescale {r['guidance_rescale']}), {v.fs_kind} {r['fs']}"
                  f"{', dynamic rescale ' + str(v.dynamic_rescale) if v.dynamic_rescale else ''}"
                  f"{', first and last frame given' if v.interp else ''}; 4-channel KL-f8 latents.",
        )

    def default_objective(self):
        return self._objective

    def provides(self) -> tuple[str, ...]:
        keys = ["context", "concat", "fs", "first_frame"]
        for key in SIGNAL_KEYS:
            keys += [key, f"{key}_frames"]
        return (*keys, CONTROL_KEY)

    def example_batch(self, batch_size: int = 2, *,
                      generator: torch.Generator | None = None) -> dict[str, Any]:
        """Video (its first frame the image), the per-frame signals, a control video and a prompt, at the
        clip's size."""
        raw: dict[str, Any] = example_inputs(self.clip(), batch_size, generator=generator,
                                             per_frame={"action": 4, "proprio": 3, "ee_pos": 3})
        raw[self.config.prompt_key] = self.config.prompt or "a robot arm pushes a puck"
        return raw

    # -- autoencoder -------------------------------------------------------------------------
    @property
    def spatial(self) -> int:
        return 2 ** (len(self.model.sizes.vae_channels) - 1)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] → scaled latents ``(B, 4, T, H/8, W/8)`` (posterior mean), per
        frame."""
        b, _, t = video.shape[:3]
        frames = video.transpose(1, 2).flatten(0, 1)
        z = self.model.vae_encode(frames.to(self.device)).float()
        return z.unflatten(0, (b, t)).transpose(1, 2)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        b, _, t = latents.shape[:3]
        frames = self.model.vae_decode(latents.transpose(1, 2).flatten(0, 1).to(self.device)).float()
        return frames.unflatten(0, (b, t)).transpose(1, 2).clamp(-1, 1)

    # -- the conditioning towers, loaded on first use --------------------------------------------
    @property
    def conditioning(self):
        """The text and vision towers and the resampler (a :class:`DynamiCrafterModel` of those parts), loaded
        from the checkpoint onto the backbone's device, in its dtype, the first time they are needed."""
        towers = self.__dict__["_conditioning"]
        if towers is None:
            from workbench_dynamicrafter.model import from_checkpoint

            file, variant, sizes = self.__dict__["_checkpoint"]
            if file is None:  # random weights: the towers are random too (their own seed)
                from workbench_dynamicrafter.model import random_model

                towers = random_model(variant, device=self.device, dtype=self.dtype,
                                      parts=("text", "vision", "resampler"), seed=self.config.seed, **sizes)
            else:
                towers = from_checkpoint(file, variant, device=self.device, dtype=self.dtype,
                                         parts=("text", "vision", "resampler"), **sizes)
            self.__dict__["_conditioning"] = towers  # (eval mode, no gradients: from_checkpoint's)
        return towers

    @property
    def conditioning_loaded(self) -> bool:
        """Whether the conditioning towers are in memory (a run fed from a latent cache never loads them)."""
        return self.__dict__["_conditioning"] is not None

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        towers = self.__dict__.get("_conditioning")
        if towers is not None and recurse:  # not submodules, but they go where the backbone goes
            towers._apply(fn)
        return out

    # -- conditions --------------------------------------------------------------------------
    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompts → ``(B, 77)`` token ids as open_clip makes them (start, BPE, end, zeros)."""
        from workbench_dynamicrafter.encoders import tokenize

        if self._tokenizer is None and self.model.sizes.text_vocab == 49408:
            from transformers import CLIPTokenizer

            self._tokenizer = CLIPTokenizer.from_pretrained(self.config.tokenizer)
        return tokenize(list(prompts), self._tokenizer, self.model.sizes)

    def encode_text(self, prompts: Sequence[str]) -> torch.Tensor:
        """``(B, 77, 1024)`` text context; each distinct prompt is encoded once per backbone and kept."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._text_cache]
        with torch.no_grad():
            for prompt in missing:  # one by one: an embedding never depends on the prompts beside it
                self._text_cache[prompt] = self.conditioning.encode_text(self.tokenize([prompt]))[0]
        return torch.stack([self._text_cache[p] for p in prompts])

    def image_context(self, image: torch.Tensor) -> torch.Tensor:
        """First frames ``(B, 3, H, W)`` in [-1, 1] → the resampled image tokens ``(B, 16 T, 1024)``, frame
        by frame (a frame's tokens never depend on the batch it came in)."""
        towers = self.conditioning
        with torch.no_grad():
            return torch.cat([towers.resample(towers.encode_image(image[i:i + 1]))
                              for i in range(image.shape[0])])

    def zero_image_context(self, batch_size: int, height: int, width: int) -> torch.Tensor:
        """The unconditional image tokens: a zero image at the generation size (cached per size)."""
        key = (height, width)
        if key not in self._zero_image_cache:
            self._zero_image_cache[key] = self.image_context(
                torch.zeros(1, 3, height, width, device=self.device))[0]
        return self._zero_image_cache[key].expand(batch_size, -1, -1)

    def _image(self, raw: Mapping[str, Any], key: str) -> torch.Tensor:
        image = torch.as_tensor(raw[key]).float().to(self.device)
        if image.ndim != 4 or image.shape[1] != 3:
            raise DataError(f"dynamicrafter: '{key}' must be (B, 3, H, W) in [-1, 1], "
                            f"got {tuple(image.shape)}.")
        return image

    def prepare_batch(self, raw: Mapping[str, Any] | Batch) -> Batch:
        """Raw data → :class:`Batch`.

        ``raw`` holds ``"video"`` ``(B, 3, T, H, W)`` in [-1, 1] (or uint8 ``(B, T, H, W, 3)``) for
        training, or ``"image"`` ``(B, 3, H, W)`` (and ``"last_image"`` for ``512_interp``) plus
        ``"frames"`` (or per-frame signals) for generation; text as ``"prompt"`` (or the configured
        ``prompt_key``) or the config's default prompt; ``"fs"`` (frame stride / fps, default the
        variant's); per-frame ``"action"`` (or ``"actions"``), ``"proprio"``, ``"ee_pos"`` ``(B, T, D)``; a
        control video ``"control"`` ``(B, C, T, H, W)``.
        Every latent frame is predicted (the image is a condition, not a given latent frame).
        """
        if isinstance(raw, Batch):
            return raw
        if not isinstance(raw, Mapping):
            raise DataError(f"dynamicrafter.prepare_batch expects a mapping of tensors, "
                            f"got {type(raw).__name__}.")
        self.card.check_request(raw, backbone="dynamicrafter", text_keys=(self.config.prompt_key,),
                                fix="DynamiCrafter always generates from a first frame; "
                                    "the text is optional.")
        interp = self.variant.interp
        with torch.no_grad():
            context = first_latent = last_latent = None
            if "latents" in raw:  # a latent cache's items (see encode_item)
                latents, context, first = self._cached(raw)
                has_target = True
            elif "video" in raw:
                video = as_video(raw["video"], "video").to(self.device)
                self._check_size(video.shape[-2:], "video")
                latents = self.encode(video)
                first = video[:, :, 0]
                has_target = True
            elif "image" in raw:
                first = self._image(raw, "image")
                self._check_size(first.shape[-2:], "image")
                if interp and "last_image" not in raw:
                    raise DataError("dynamicrafter 512_interp generates between two frames: give 'image' "
                                    "(the first) and 'last_image' (the last), each (B, 3, H, W) in [-1, 1].")
                last = self._image(raw, "last_image") if interp else first
                frames = requested_frames(raw, self.recipe()["num_frames"])
                h, w = (s // self.spatial for s in first.shape[-2:])
                latents = torch.zeros(first.shape[0], self.model.sizes.latent_channels, frames, h, w,
                                      device=self.device)
                first_latent = self.encode(first[:, :, None])[:, :, 0]
                last_latent = self.encode(last[:, :, None])[:, :, 0]
                has_target = False
            else:
                raise DataError(f"dynamicrafter.prepare_batch needs 'video' (B, 3, T, H, W), "
                                f"or 'image' (B, 3, H, W) to generate from a first frame; "
                                f"got keys {sorted(raw)}.")
            b, _, frames = latents.shape[:3]
            # the VAE works frame by frame: a clip's first latent frame is its first frame's
            if first_latent is None:
                first_latent, last_latent = latents[:, :, 0], latents[:, :, -1]
            if context is None:
                context = self.context(raw, first)
            if interp:
                concat = torch.zeros_like(latents)
                concat[:, :, 0] = first_latent
                concat[:, :, -1] = last_latent
            else:
                concat = first_latent[:, :, None].expand(-1, -1, frames, -1, -1).contiguous()
        fs = torch.as_tensor(raw.get("fs", self.recipe()["fs"]),
                             device=self.device).long().expand(b).contiguous()
        cond: dict[str, Any] = {"context": context, "concat": concat, "fs": fs, "first_frame": first_latent,
                                "image": first}
        per_frame = add_signals(cond, raw, batch_size=b, frames=frames, ratio=1, device=self.device,
                                plugin="dynamicrafter")
        mask = torch.ones(b, frames, device=self.device)
        return Batch(latents=latents, cond=cond, loss_mask=mask, per_frame=frozenset(per_frame),
                     meta={"has_target": has_target})

    def generation_inputs(self, video: torch.Tensor) -> dict[str, Any]:
        """The first frames ``"image"``, and for ``512_interp`` the last ones ``"last_image"`` too."""
        inputs = {"image": video[:, :, 0]}
        if self.variant.interp:
            inputs["last_image"] = video[:, :, -1]
        return inputs

    def context(self, raw: Mapping[str, Any], first: torch.Tensor) -> torch.Tensor:
        """The U-Net's cross-attention context ``(B, 77 + 16 T, D)``: the text of ``raw`` (prompts through
        ``prompt_key`` / ``prompt_template`` / ``prompt``) and the first frames' resampled image tokens."""
        c = self.config
        prompts = prompts_from(raw, c.prompt_key, c.prompt, c.prompt_template, first.shape[0],
                               "dynamicrafter")
        return torch.cat([self.encode_text(prompts).to(self.device), self.image_context(first)], dim=1)

    def _cached(self, raw: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(latents, context, first frames)`` of collated :meth:`encode_item` items, checked."""
        latents = torch.as_tensor(raw["latents"])
        channels = self.model.sizes.latent_channels
        if latents.ndim != 5 or latents.shape[1] != channels or not latents.is_floating_point():
            raise DataError(f"dynamicrafter: 'latents' must be float (B, {channels}, T, h, w) as encode() "
                            f"returns them, got {tuple(latents.shape)} {latents.dtype}. Pass 'video' instead "
                            f"to have them encoded.")
        missing = [k for k in ("context", "image") if raw.get(k) is None]
        if missing:
            raise DataError(f"dynamicrafter: a batch of 'latents' needs {missing} beside them "
                            f"(the text + image context and the first frames), as encode_item makes them. "
                            f"Pass 'video' instead, or rebuild the latent cache with "
                            f"`workbench cache-latents`.")
        context = torch.as_tensor(raw["context"]).to(self.device)  # in the dtype the towers computed it in
        first = torch.as_tensor(raw["image"]).float().to(self.device)
        return latents.to(self.device), context, first

    def encode_item(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """One dataset item with the frozen encoders' work done: ``"video"`` → ``"latents"`` ``(4, T, h, w)``
        (the VAE, frame by frame), its text and first frame → ``"context"`` ``(77 + 16 T, D)`` (the CLIP text
        tower, and the CLIP vision tower through the resampler), and ``"image"`` (the first frame, which
        sampling starts from); everything else kept. ``prepare_batch`` of collated items equals that of the
        collated raw items, bit for bit, without loading the conditioning towers. ``None`` without
        ``"video"``."""
        if "video" not in item:
            return None
        raw = {k: v for k, v in item.items() if k != "video"}
        video = as_video(torch.as_tensor(item["video"])[None], "video").to(self.device)
        self._check_size(video.shape[-2:], "video")
        with torch.no_grad():
            latents = self.encode(video)
            first = video[:, :, 0]
            context = self.context({k: ([v] if isinstance(v, str) else v) for k, v in raw.items()}, first)
        return {**raw, "latents": latents[0].cpu(), "context": context[0].cpu(), "image": first[0].cpu()}

    def _check_size(self, hw: Sequence[int], key: str) -> None:
        multiple = self.spatial * 2 ** (len(self.model.sizes.channel_mult) - 1)
        if hw[0] % multiple or hw[1] % multiple:
            raise DataError(f"dynamicrafter: '{key}' is {hw[0]}x{hw[1]} pixels; height and width must be "
                            f"multiples of {multiple} (the VAE's {self.spatial}x and "
                            f"the U-Net's downsampling). Resize or crop the frames, e.g. to "
                            f"{self.variant.height}x{self.variant.width} for the {self.variant.name} model.")

    # -- denoising ---------------------------------------------------------------------------
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        """The frozen U-Net's prediction (ε or v) at ``x_t`` (``t``: training timesteps ``(B,)``)."""
        for key in ("context", "concat", "fs"):
            if key not in cond:
                raise DataError(f"dynamicrafter.denoise needs cond[{key!r}] from prepare_batch; "
                                f"got {sorted(cond)}.")
        dtype = self.model.unet.out[2].weight.dtype
        t = torch.as_tensor(t, device=x_t.device)
        t = t.expand(x_t.shape[0]) if t.ndim == 0 else t
        x = torch.cat([x_t, cond["concat"].to(x_t.dtype)], dim=1).to(dtype)
        out = self.model.unet(x, t, context=cond["context"].to(dtype), fs=cond["fs"])
        return out.to(x_t.dtype)

    def planning_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(t, cond)`` of the shapes :meth:`denoise` is called with for ``latents`` (zeros, on their
        device): a DDPM timestep, 77 text tokens and 16 image tokens per frame, the concatenated first frame,
        the fs.
        For memory plans."""
        b, _, frames = latents.shape[:3]
        s = self.model.sizes
        tokens = s.text_length + s.resampler_queries * frames
        t = torch.full((b,), 500, device=latents.device, dtype=torch.long)
        return t, {"context": torch.zeros(b, tokens, s.context_dim, device=latents.device),
                "concat": torch.zeros_like(latents),
                "fs": torch.full((b,), self.recipe()["fs"], device=latents.device, dtype=torch.long)}

    def latent_shape(self, clip) -> tuple[int, ...]:
        """``(C, T, h, w)``: the VAE encodes each frame on its own, ``spatial`` times smaller in space."""
        return (self.model.sizes.latent_channels, clip.frames, clip.height // self.spatial,
                clip.width // self.spatial)

    def frozen_encoders(self) -> tuple[torch.nn.Module, ...]:
        """The conditioning towers (text, image, resampler), held beside the U-Net and loaded when first
        needed."""
        return (self.conditioning,)

    def weight_files(self) -> tuple[Path, ...]:
        """The checkpoint every part loads from, the conditioning towers included (``()`` with
        ``random_weights``)."""
        file = self.__dict__["_checkpoint"][0]
        return (Path(file),) if file is not None else ()

    def keep_in_float32(self) -> tuple[str, ...]:
        """The U-Net's float32 GroupNorms (its ResBlocks' and its output's, which compute in float32 as the
        release's do): moved to bf16, the backbone keeps their weights in float32."""
        from workbench_dynamicrafter.unet import Float32GroupNorm

        model = self.__dict__.get("_modules", {}).get("model")
        if model is None:
            return ()
        return tuple(f"model.{name}" for name, m in model.named_modules() if isinstance(m, Float32GroupNorm))

    # -- adapters inside the U-Net ----------------------------------------------------------
    def inside_spec(self) -> InsideSpec:
        """Where ``lora`` / ``action_modulation`` / ``controlnet`` reach: the U-Net's attention
        projections, and its stages after the stem (frames folded into the batch, ``(B T) C h w``).
        The input stages after the stem and its temporal attention are the chain a ControlNet copies."""
        unet = self.model.unet
        down = tuple(unet.input_blocks)[1:]  # the stem runs before init_attn: the chain starts after it
        blocks = (*down, unet.middle_block, *unet.output_blocks)
        return InsideSpec(root=unet, root_name="model.unet",
                          lora_targets=("to_q", "to_k", "to_v", "to_out.0"), blocks=blocks,
                          widths=tuple(stage_width(b) for b in blocks), branch_blocks=len(down),
                          layout="frames")

    # -- sampling ----------------------------------------------------------------------------
    def branch(self, batch: Batch, context: torch.Tensor, name: str) -> Batch:
        """``batch`` with another text/image context and the adapter's signals zeroed (a guidance branch)."""
        cond = dict(batch.cond)
        cond["context"] = context
        for key in [k for k in cond if k.removesuffix("_frames") in SIGNAL_KEYS]:
            if isinstance(cond[key], torch.Tensor):
                cond[key] = torch.zeros_like(cond[key])
        return Batch(latents=batch.latents, cond=cond, loss_mask=batch.loss_mask, per_frame=batch.per_frame,
                     meta={**batch.meta, "branch": name})

    def _guidance(self, guidance_scale: float | None = None,
                 image_guidance_scale: float | None = None) -> tuple[float, float | None]:
        """The text and image guidance scales a ``generate`` call uses: the recipe's unless given."""
        r = self.recipe()
        return (r["guidance_scale"] if guidance_scale is None else guidance_scale,
                r["image_guidance_scale"] if image_guidance_scale is None else image_guidance_scale)

    def predictions_per_step(self, batch: Batch, guidance_scale: float | None = None,
                             image_guidance_scale: float | None = None, **sampler_kwargs: Any) -> int:
        """One without guidance; with it the unconditional branch too, and with an image guidance
        scale the text-only branch as well (see ``sampling.ddim_loop``)."""
        guidance, image_guidance = self._guidance(guidance_scale, image_guidance_scale)
        if guidance == 1.0:
            return 1
        return 2 if image_guidance is None else 3

    def run_sampler(self, batch: Batch, *, steps: int, sampler: str, generator: torch.Generator | None,
                  compose_fn, on_step, guidance_scale: float | None = None,
                  image_guidance_scale: float | None = None, guidance_rescale: float | None = None,
                  eta: float | None = None, spacing: str | None = None,
                  initial_noise: torch.Tensor | None = None) -> torch.Tensor:
        """Our DDIM loop (see ``sampling``); keyword arguments default to :meth:`recipe`."""
        r = self.recipe()
        guidance, image_guidance = self._guidance(guidance_scale, image_guidance_scale)
        rescale = r["guidance_rescale"] if guidance_rescale is None else guidance_rescale
        tables = DDIMTables(self.variant, steps, r["spacing"] if spacing is None else spacing,
                            r["eta"] if eta is None else eta, batch.latents.device)
        uncond = uncond_image = None
        if guidance != 1.0:
            b, n_text = batch.batch_size, self.model.sizes.text_length
            empty = self.encode_text([""] * b).to(batch.cond["context"].dtype)
            h, w = (s * self.spatial for s in batch.latents.shape[-2:])
            uncond = self.branch(batch, torch.cat([empty, self.zero_image_context(b, h, w)], 1), "uncond")
            if image_guidance is not None:
                uncond_image = self.branch(batch, torch.cat([empty, batch.cond["context"][:, n_text:]], 1),
                                           "uncond_text")
        x = initial_noise if initial_noise is not None else torch.randn(
            batch.latents.shape, generator=generator, device=batch.latents.device, dtype=batch.latents.dtype)
        return ddim_loop(x, tables, self.variant, cond=batch, uncond=uncond, uncond_image=uncond_image,
                         guidance_scale=guidance, image_guidance_scale=image_guidance,
                         guidance_rescale=rescale, compose_fn=compose_fn, on_step=on_step,
                         generator=generator)
