"""``wan22_ti2v``: Wan2.2 TI2V-5B, delegated to diffusers' own Wan pipelines.

Nothing of Wan is re-implemented here. The VAE, the UMT5 text encoder, the transformer and the
scheduler are diffusers' classes loaded from a **diffusers-format** directory (one with a
``model_index.json``, such as the ``Wan-AI/Wan2.2-TI2V-5B-Diffusers`` release); sampling runs
``WanImageToVideoPipeline`` (first frame given) or ``WanPipeline`` (text only) unchanged.

The adapter is injected by wrapping the one call every prediction flows through: the
transformer's forward. While ``generate`` runs, each call the pipeline makes is handed to the
composition (``compose_fn``); the frozen base's part of it is read from that very call, made
lazily with the pipeline's own arguments, so a zero adapter reproduces the pipeline bit for bit.
Per step, Wan calls the transformer once for the prompt and, under classifier-free guidance,
once more for the negative prompt; that second call is composed with the negative prompt's
embeddings and the adapter's signals (``action``, ``proprio``, ``ee_pos``) zeroed, which is what
condition dropout shows the adapter in training. Steps are reported to ``on_step`` from the
pipeline's ``callback_on_step_end``, so recording, forks and previews work unchanged.

Time: ``t`` is the flow-matching noise level σ in [0, 1] (``x_t = (1 - σ) x0 + σ ε``, the
transformer predicts ``ε - x0``); the transformer is called with ``1000 σ``. TI2V conditions on
the first latent frame by giving its tokens timestep 0 and the clean latent (Wan2.2's per-token
timestep expansion); ``denoise`` does the same for training.

A raw upstream release (``Wan2.2_VAE.pth``, ``models_t5_umt5-xxl-enc-bf16.pth``, sharded
``diffusion_pytorch_model*.safetensors`` without ``model_index.json``) must be converted
first: use the ``-Diffusers`` release, or diffusers' ``scripts/convert_wan_to_diffusers.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench import Batch, InsideSpec
from workbench.backbones.diffusers_bridge import (
    DiffusersBackbone,
    DiffusersConfig,
    Injection,
    load_pipeline,
    prompts_from,
    transformer_output,
    uncond_batch,
)
from workbench.config import check
from workbench.core.capabilities import InsideAccess
from workbench.errors import CheckpointError, CompositionError, DataError

# Wan2.2 TI2V-5B's own sampling settings (its release config): 50 steps, guidance 5, 1280x704, 121 frames
# at 24 fps.
REAL_DEFAULTS = dict(steps=50, guidance_scale=5.0, height=704, width=1280, num_frames=121, fps=24)
SAMPLER_NAMES = {"UniPCMultistepScheduler": "unipc", "FlowMatchEulerDiscreteScheduler": "flow_euler"}


@dataclass
class Wan22Config(DiffusersConfig):
    """How to load and drive Wan2.2 TI2V: the :class:`DiffusersConfig` fields, and

    ``dtype``: ``auto`` = the card's precision on the config's ``device`` (the VAE always runs in float32).
    ``first_frame``: condition on the first frame (TI2V image-to-video); ``False`` = text only.
    ``max_sequence_length``: prompt tokens. Sampling defaults left ``None`` keep the real
    model's (50 steps, guidance 5.0, 704x1280, 121 frames, 24 fps).
    """

    first_frame: bool = True
    max_sequence_length: int = 512

    def __post_init__(self):
        super().__post_init__()
        check(self.max_sequence_length >= 1, "max_sequence_length",
              f"must be >= 1, got {self.max_sequence_length}.")


class _WanInjection(Injection):
    """Wan calls the transformer once for the prompt and, under guidance, once for the negative prompt.

    In image-to-video mode the pipeline hands the transformer its latents with the first frame's replaced by
    the image's (that frame's tokens at timestep 0), while the scheduler steps latents whose first frame is
    still noise. A step's record keeps what the composition saw: the first frame the transformer was given.
    """

    # the latent frame 0 of this step's conditional call (image-to-video)
    first_frame: torch.Tensor | None = None

    def forward(self, hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image=None,
                return_dict=True, attention_kwargs=None):
        branch = self.calls_in_step  # 0: the prompt, 1: the negative prompt (the pipeline's order)
        self.calls_in_step += 1
        if branch == 0 and self.backbone.config.first_frame:
            self.first_frame = hidden_states[:, :, 0]
        if branch > 1 or (branch == 1 and self.uncond is None):
            raise CompositionError(
                f"wan22_ti2v: the pipeline called the transformer {branch + 1} times in step {self.step}; "
                f"Wan2.2 TI2V makes one call per step, two under classifier-free guidance. "
                f"Is this a two-expert (A14B) pipeline? Only the single-transformer TI2V-5B is supported."
            )
        batch = self.batch if branch == 0 else self.uncond

        def call():
            return self.native_forward(hidden_states=hidden_states, timestep=timestep,
                                       encoder_hidden_states=encoder_hidden_states,
                                       encoder_hidden_states_image=encoder_hidden_states_image,
                                       attention_kwargs=attention_kwargs, return_dict=False)[0]

        out = self.compose(call, hidden_states, [(slice(0, hidden_states.shape[0]), batch)])
        return (out,) if not return_dict else transformer_output(out)

    def on_step_end(self, pipe, index: int, timestep, callback_kwargs: dict) -> dict:
        if self.first_frame is not None and self.observed is not None:
            step, sample, prediction = self.observed
            sample = sample.clone()
            sample[:, :, 0] = self.first_frame.to(sample.dtype)
            self.observed, self.first_frame = (step, sample, prediction), None
        return super().on_step_end(pipe, index, timestep, callback_kwargs)


class Wan22TI2V(DiffusersBackbone, InsideAccess):
    """Wan2.2 TI2V-5B (text + first frame → video) as a frozen backbone.

    >>> base = Wan22TI2V.from_pretrained("/models/Wan2.2-TI2V-5B-Diffusers")   # bf16 on a GPU
    >>> batch = base.prepare_batch({"video": clips, "prompt": "a robot arm pushes a puck", "action": actions})
    >>> latents = base.generate({"image": first_frames, "prompt": "...", "frames": 121}, steps=50)
    """

    config_class = Wan22Config
    name = "wan22_ti2v"
    model_name = "Wan2.2"
    release = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    convert = ("download Wan-AI/Wan2.2-TI2V-5B-Diffusers instead, "
               "or convert the upstream checkpoint with diffusers' scripts/convert_wan_to_diffusers.py "
               "(model type Wan2.2-TI2V-5B) and point path at its output.")
    mode_fix = ("The mode is first_frame in the backbone config: true = text+image-to-video, "
                "false = text-to-video.")
    sampler_inputs = ("image",)  # the first frame's pixels, which the i2v pipeline encodes itself
    real_defaults = REAL_DEFAULTS
    float32_components = ("vae",)  # the Wan VAE runs in float32, as upstream recommends

    def tiny_pipeline(self) -> Path:
        from workbench_wan22.tiny import FIXTURE

        return FIXTURE.ensure()

    def real_config(self) -> Path:
        """The Wan2.2-TI2V-5B configuration shipped with the plugin (no weights; see its PROVENANCE.md)."""
        return Path(__file__).parent / "real"

    def load(self) -> torch.dtype:
        from diffusers import WanImageToVideoPipeline, WanPipeline

        folder, c = self.folder, self.config
        loaded, dtype = load_pipeline(folder, plugin=self.name, device=c.device, dtype=c.dtype,
                                      float32=self.float32_components, skip=("text_encoder",),
                                      random_weights=c.random_weights, seed=c.seed)
        parts = loaded.components
        problems = []
        if (parts.get("transformer_2") is not None
                or getattr(loaded.config, "boundary_ratio", None) is not None):
            problems.append("it has two experts (transformer_2 / boundary_ratio): "
                            "that is Wan2.2 A14B, not TI2V-5B")
        if not getattr(loaded.config, "expand_timesteps", False):
            problems.append("expand_timesteps is false in model_index.json: that is a Wan2.1-style pipeline")
        if parts["vae"].config.z_dim != parts["transformer"].config.in_channels:
            problems.append(f"the VAE has {parts['vae'].config.z_dim} latent channels "
                            f"but the transformer takes {parts['transformer'].config.in_channels} "
                            f"(an image-conditioned I2V transformer?)")
        if problems:
            raise CheckpointError(f"wan22_ti2v: {folder} is not a Wan2.2 TI2V checkpoint: "
                                  + "; ".join(problems)
                                  + ". Use the Wan-AI/Wan2.2-TI2V-5B-Diffusers release.")
        self.adopt_components(parts)  # the pipelines below only borrow the modules
        # diffusers' WanImageToVideoPipeline conditions every sample on one image: one clip per generate()
        self.max_generate_batch = 1 if c.first_frame else None
        shared = dict(tokenizer=self.tokenizer, text_encoder=None,  # the text encoder: on first use
                      vae=self.vae, scheduler=self.scheduler, transformer=self.transformer,
                      expand_timesteps=True)
        self.pipelines = {"i2v": WanImageToVideoPipeline(**shared), "t2v": WanPipeline(**shared)}
        for pipe in self.pipelines.values():
            pipe.set_progress_bar_config(disable=True)
        vae = self.vae.config
        self.spatial = vae.scale_factor_spatial
        self.temporal = vae.scale_factor_temporal
        self.patch = tuple(self.transformer.config.patch_size)  # (1, 2, 2)
        self.spatial_patch = self.patch[1]
        self.latent_channels = vae.z_dim
        self.train_timesteps = self.scheduler.config.num_train_timesteps
        self.register_buffer("latents_mean", torch.tensor(vae.latents_mean).view(1, -1, 1, 1, 1),
                             persistent=False)
        self.register_buffer("latents_inv_std", 1.0 / torch.tensor(vae.latents_std).view(1, -1, 1, 1, 1),
                             persistent=False)
        self.to(self.transformer.device)  # the buffers join the weights' device
        return dtype

    # -- card --------------------------------------------------------------------------------
    def card_fields(self) -> dict[str, Any]:
        scheduler = self.scheduler.config
        return dict(
            model_id="wan2.2-ti2v",
            family="wan2.2",
            sampler=SAMPLER_NAMES.get(type(self.scheduler).__name__, type(self.scheduler).__name__.lower()),
            shift=getattr(scheduler, "flow_shift", None) or getattr(scheduler, "shift", None),
            vae_dtype="float32",
            capabilities=("t2v", "i2v", "ti2v"),
            mode="ti2v" if self.config.first_frame else "t2v",
            notes="Wan2.2 TI2V-5B through diffusers' WanImageToVideoPipeline / WanPipeline "
                  "(expand_timesteps): 48-channel latents, 16x spatial and 4x temporal compression, "
                  "UMT5 text encoder; the first latent frame is the condition (token timestep 0).",
        )

    def text_conditions(self) -> tuple[str, ...]:
        # the batch's "image" is pipeline input, not a condition
        return ("prompt_embeds", "negative_prompt_embeds",
                *(("first_frame",) if self.config.first_frame else ()))

    # -- autoencoder -------------------------------------------------------------------------
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] → normalised latents ``(B, 48, 1 + (T-1)/4, H/16, W/16)``.

        The distribution's mode, normalised with the VAE's own ``latents_mean`` / ``latents_std``
        exactly as the pipeline normalises its conditioning frame.
        """
        z = self.vae.encode(video.to(device=self.vae.device, dtype=self.vae.dtype)).latent_dist.mode()
        z = z.float()
        return (z - self.latents_mean.to(z.device)) * self.latents_inv_std.to(z.device)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents → video ``(B, 3, T, H, W)`` in [-1, 1] (the pipeline's own denormalisation)."""
        z = latents.float() / self.latents_inv_std.to(latents.device) + self.latents_mean.to(latents.device)
        video = self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0]
        return video.float().clamp(-1, 1)

    # -- text --------------------------------------------------------------------------------
    def encode_text(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompts → UMT5 embeddings ``(B, L, 4096)`` through the pipeline's own ``encode_prompt``,
        cached per prompt.

        The text encoder is large next to any adapter, so each distinct prompt is encoded once per
        backbone and kept (in the transformer's dtype).
        """
        def encode(missing: list[str]) -> torch.Tensor:
            return self.pipelines["t2v"].encode_prompt(
                missing, do_classifier_free_guidance=False,
                max_sequence_length=self.config.max_sequence_length, device=self.device,
                dtype=self.transformer.dtype)[0]

        embeds = self.cached_text(prompts, encode,
                                  "Pass precomputed 'prompt_embeds' (B, L, D) in the batch instead, "
                                  "or use a pipeline directory with the UMT5 text encoder.")
        return torch.stack([e.to(self.device) for e in embeds])

    def _text(self, raw: Mapping[str, Any], batch_size: int) -> dict[str, torch.Tensor]:
        cond = {}
        for key in ("prompt_embeds", "negative_prompt_embeds"):
            value = raw.get(key)
            if value is not None:
                value = torch.as_tensor(value)
                width = self.transformer.config.text_dim
                if value.ndim != 3 or value.shape[0] != batch_size or value.shape[2] != width:
                    raise DataError(f"wan22_ti2v: '{key}' must be (B, L, {width}) with B={batch_size}, got "
                                    f"{tuple(value.shape)}. Compute it with base.encode_text(prompts).")
                cond[key] = value.to(device=self.device, dtype=self.transformer.dtype)
        if "prompt_embeds" not in cond:
            c = self.config
            prompts = prompts_from(raw, c.prompt_key, c.prompt, c.prompt_template, batch_size, "wan22_ti2v")
            cond["prompt_embeds"] = self.encode_text(prompts)
        return cond

    # -- batches -----------------------------------------------------------------------------
    def prepare_batch(self, raw: Mapping[str, Any] | Batch) -> Batch:
        """Raw data → :class:`Batch`.

        ``raw`` holds ``"video"`` ``(B, 3, T, H, W)`` in [-1, 1] (or uint8 ``(B, T, H, W, 3)``) for
        training, or only ``"image"`` ``(B, 3, H, W)`` plus ``"frames"`` (or per-frame signals) for
        generation (text-to-video, ``first_frame: false``: ``"frames"`` / ``"height"`` / ``"width"``,
        default the card's); text as ``"prompt"`` (or the configured ``prompt_key``), precomputed
        ``"prompt_embeds"`` ``(B, L, 4096)``, or the config's default prompt; per-frame ``"action"``
        (or ``"actions"``), ``"proprio"``, ``"ee_pos"`` ``(B, T, D)``.

        Supplies ``prompt_embeds``, ``first_frame`` (the first frame's latent ``(B, 48, h, w)``),
        each signal pooled onto latent frames (``action`` ``(B, T', D)``: frame 0, then the mean of
        each next 4) and at full rate (``action_frames`` ``(B, T, D)``). ``loss_mask`` leaves out the
        conditioning latent frame.
        """
        return super().prepare_batch(raw)

    def latents_from(self, raw: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        if "latents" in raw or "video" in raw or ("image" not in raw and not self.config.first_frame):
            return super().latents_from(raw)  # clips (or a latent cache's), or a text-to-video request
        if "image" not in raw:
            raise DataError(f"wan22_ti2v.prepare_batch needs 'video' (B, 3, T, H, W), "
                            f"or 'image' (B, 3, H, W) to generate from a first frame; "
                            f"got keys {sorted(raw)}. "
                            f"For text-to-video, build the backbone with first_frame: false.")
        image = torch.as_tensor(raw["image"]).float().to(self.device)
        if image.ndim != 4 or image.shape[1] != 3:
            raise DataError(f"wan22_ti2v: 'image' must be (B, 3, H, W) in [-1, 1], got {tuple(image.shape)}.")
        latents = self.blank_latents(image.shape[0], self.frames_requested(raw), *image.shape[2:], "image")
        return latents, image[:, :, None], False

    def condition_on(self, cond: dict[str, Any], latents: torch.Tensor, video: torch.Tensor | None,
                     has_target: bool, raw: Mapping[str, Any] | None = None) -> None:
        if not self.config.first_frame:
            return
        if video is None:  # a latent cache's items carry the first frame's latent (see encode_item)
            if raw is None or raw.get("first_frame") is None:
                raise DataError("wan22_ti2v: a batch of 'latents' needs the first frame's latent "
                                "'first_frame' (B, 48, h, w) beside them, as encode_item makes it. "
                                "Pass 'video' instead, or rebuild the latent cache with "
                                "`workbench cache-latents`.")
            first = torch.as_tensor(raw["first_frame"]).to(device=self.device, dtype=latents.dtype)
        else:  # as the pipeline encodes its condition, clip by clip
            first = self.encode_clips(video[:, :, :1])[:, :, 0]
        cond["first_frame"] = first
        if not has_target:
            latents[:, :, 0] = first

    def cached_conditions(self, video: torch.Tensor) -> dict[str, torch.Tensor]:
        # what the i2v pipeline samples from
        return {"image": video[:, :, 0]} if self.config.first_frame else {}

    def batch_from(self, latents: torch.Tensor, cond: dict[str, Any], per_frame: frozenset[str],
                   video: torch.Tensor | None, has_target: bool,
                   raw: Mapping[str, Any] | None = None) -> Batch:
        mask = torch.ones(latents.shape[0], latents.shape[2], device=self.device)
        if self.config.first_frame:
            mask[:, 0] = 0  # the first latent frame is given, not predicted
        if video is not None:
            cond["image"] = video[:, :, 0]  # the first frame's pixels, which the i2v pipeline encodes itself
        elif raw is not None and raw.get("image") is not None:
            cond["image"] = torch.as_tensor(raw["image"]).float().to(self.device)
        return Batch(latents=latents, cond=cond, loss_mask=mask, per_frame=per_frame,
                     meta={"has_target": has_target})

    # -- denoising ---------------------------------------------------------------------------
    def token_timesteps(self, t: torch.Tensor, latents_shape: Sequence[int]) -> torch.Tensor:
        """Per-token transformer timesteps ``(B, T' h/2 w/2)``: ``1000 t``, and 0 on the first frame's
        tokens (TI2V)."""
        b, _, frames, h, w = latents_shape
        tokens = torch.ones(frames, h // self.patch[1], w // self.patch[2], device=t.device)
        if self.config.first_frame:
            tokens[0] = 0
        return (tokens.flatten()[None] * (t.float() * self.train_timesteps)[:, None])  # (B, seq)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        """The frozen transformer's velocity at ``x_t`` (``t``: noise level in [0, 1], ``(B,)``).

        Inside ``generate`` this is the pipeline's own call; elsewhere (training, probes) the same
        call is made here: the first latent frame replaced by the clean condition, its tokens at
        timestep 0, the others at ``1000 t``.
        """
        native = self.native_prediction(x_t)
        if native is not None:
            return native
        if "prompt_embeds" not in cond:
            raise DataError("wan22_ti2v.denoise needs cond['prompt_embeds'] (B, L, 4096) from prepare_batch.")
        t = torch.as_tensor(t, device=x_t.device)
        t = t.expand(x_t.shape[0]) if t.ndim == 0 else t
        hidden = x_t
        if self.config.first_frame:
            hidden = x_t.clone()
            hidden[:, :, 0] = cond["first_frame"].to(x_t.dtype)
        dtype = self.transformer.dtype
        out = self.transformer(hidden_states=hidden.to(dtype), timestep=self.token_timesteps(t, x_t.shape),
                               encoder_hidden_states=cond["prompt_embeds"].to(dtype), return_dict=False)[0]
        return out.to(x_t.dtype)

    text_encoder_note = "Wan2.2's UMT5-XXL encoder: about 5.7 B parameters, 11.4 GB in bf16"

    def planning_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(t, cond)`` of the shapes :meth:`denoise` is called with for ``latents`` (zeros, on their
        device): ``max_sequence_length`` prompt tokens of the text width, and the first frame's latent.
        For memory plans."""
        b, c, _, h, w = latents.shape
        dtype = self.transformer.dtype
        embeds = torch.zeros(b, self.config.max_sequence_length, self.transformer.config.text_dim,
                             device=latents.device, dtype=dtype)
        return self.planning_time(latents), {"prompt_embeds": embeds,
                                             "first_frame": torch.zeros(b, c, h, w, device=latents.device)}

    # -- adapters inside the transformer -------------------------------------------------------
    def inside_spec(self) -> InsideSpec:
        """Where ``lora`` / ``action_modulation`` / ``controlnet`` reach: the attention projections of
        the transformer's blocks (LoRA), and the blocks themselves (tokens ``(B, T' h w, W)``, frame-major),
        every one a link of the chain a ControlNet copies (each takes the hidden state, the text, the
        timestep projection and the rotary embedding)."""
        tr = self.transformer
        width = tr.config.num_attention_heads * tr.config.attention_head_dim
        return InsideSpec(root=tr, root_name="transformer",
                          lora_targets=("to_q", "to_k", "to_v", "to_out.0"), blocks=tuple(tr.blocks),
                          widths=(width,) * len(tr.blocks), branch_blocks=len(tr.blocks), layout="tokens")

    # -- sampling ----------------------------------------------------------------------------
    def negative_embeddings(self, batch: Batch) -> torch.Tensor:
        given = batch.cond.get("negative_prompt_embeds")
        if given is not None:
            return given
        return self.encode_text([self.config.negative_prompt] * batch.batch_size)

    def run_sampler(self, batch: Batch, *, steps: int, sampler: str, generator: torch.Generator | None,
                  compose_fn, on_step, guidance_scale: float | None = None,
                  **pipeline_kwargs) -> torch.Tensor:
        """Run the diffusers pipeline with the composition injected; returns its final (normalised) latents.

        ``guidance_scale`` defaults to the card's; other keyword arguments go to the pipeline.
        """
        guidance = self.guidance_for(guidance_scale)
        b = batch.batch_size
        uncond = None
        kwargs: dict[str, Any] = dict(prompt_embeds=batch.cond["prompt_embeds"])
        if guidance > 1:
            negative = self.negative_embeddings(batch)
            kwargs["negative_prompt_embeds"] = negative
            uncond = uncond_batch(batch, negative)
        if self.config.first_frame:
            if b != 1:
                raise CompositionError(
                    f"wan22_ti2v: image-to-video generation takes one clip per call (diffusers' "
                    f"WanImageToVideoPipeline conditions every sample on one image); this batch has {b}. "
                    f"Generate each clip on its own: batch.select([i]) for i in range({b})."
                )
            pipe = self.pipelines["i2v"]
            # the pipeline takes [0, 1] and normalises
            kwargs["image"] = (batch.cond["image"].float() + 1) / 2
        else:
            pipe = self.pipelines["t2v"]
        injection = _WanInjection(self, batch, uncond, compose_fn, on_step, steps)
        return self.run_pipeline(pipe, injection, batch, steps=steps, guidance=guidance, generator=generator,
                                 max_sequence_length=self.config.max_sequence_length, **kwargs,
                                 **pipeline_kwargs)
