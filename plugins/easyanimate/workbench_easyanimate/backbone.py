"""``easyanimate``: EasyAnimate V5.1 text-to-video, delegated to diffusers' own ``EasyAnimatePipeline``.

Nothing of EasyAnimate is re-implemented: the MagViT VAE (``AutoencoderKLMagvit``), the Qwen2-VL
text encoder, the MMDiT transformer and the flow-matching Euler scheduler are diffusers' classes
loaded from a **diffusers-format** directory (``model_index.json``, e.g. the
``alibaba-pai/EasyAnimateV5.1-12b-zh-diffusers`` release), and sampling runs the pipeline
unchanged, with the adapter injected by wrapping the transformer's forward.

Classifier-free guidance: EasyAnimate concatenates the unconditional and conditional halves
into **one** transformer call (``[negative prompt; prompt]``). The injected composition splits
that batch: the conditional half is composed with the batch's own conditions, the
unconditional half with the negative prompt's embeddings and the adapter's signals
(``action``, ``proprio``, ``ee_pos``) zeroed, which is what condition dropout shows the adapter
in training; the halves are re-joined in the pipeline's order. The frozen base's part of both
halves is read from that single call, made with the pipeline's own arguments, so a zero
adapter reproduces the pipeline bit for bit.

Time: ``t`` is the flow-matching noise level σ in [0, 1]; the transformer is called with
``1000 σ`` and predicts the velocity ``ε - x0``. Latents are the VAE's mode times its
``scaling_factor`` (the pipeline divides by it before decoding).

Only the text-to-video transformer is supported (its input width equals the VAE's latent
channels); the ``-InP`` and ``-Control`` variants take extra latent inputs and are refused.
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
from workbench.core.capabilities import InsideAccess
from workbench.errors import CheckpointError, CompositionError, DataError

# EasyAnimate V5.1's own settings: 50 steps, guidance 6, 49 frames at 8 fps, 512x512 (its diffusers example).
REAL_DEFAULTS = dict(steps=50, guidance_scale=6.0, height=512, width=512, num_frames=49, fps=8)
RELEASE = "alibaba-pai/EasyAnimateV5.1-12b-zh-diffusers"


@dataclass
class EasyAnimateConfig(DiffusersConfig):
    """How to load and drive EasyAnimate: the :class:`DiffusersConfig` fields. Sampling defaults
    left ``None`` keep the real model's (50 steps, guidance 6.0, 512x512, 49 frames, 8 fps)."""


class _EasyAnimateInjection(Injection):
    """One transformer call per step; under guidance its batch is ``[unconditional; conditional]``."""

    def forward(self, hidden_states, timestep, timestep_cond=None, encoder_hidden_states=None,
                encoder_hidden_states_t5=None, inpaint_latents=None, control_latents=None, return_dict=True):
        rows = hidden_states.shape[0]
        b = self.batch.batch_size
        if rows == 2 * b and self.uncond is not None:
            # conditional half composed first
            halves = [(slice(b, 2 * b), self.batch), (slice(0, b), self.uncond)]
        elif rows == b:
            halves = [(slice(0, b), self.batch)]
        else:
            raise CompositionError(
                f"easyanimate: the pipeline called the transformer with {rows} rows for a batch of {b} "
                f"({'with' if self.uncond is not None else 'without'} guidance); "
                f"expected {b}, or {2 * b} with guidance. "
                f"This diffusers version batches classifier-free guidance differently from the one the "
                f"plugin was written for; pin the diffusers version in constraints.txt."
            )
        self.calls_in_step += 1

        def call():
            return self.native_forward(hidden_states, timestep, timestep_cond=timestep_cond,
                                       encoder_hidden_states=encoder_hidden_states,
                                       encoder_hidden_states_t5=encoder_hidden_states_t5,
                                       inpaint_latents=inpaint_latents, control_latents=control_latents,
                                       return_dict=False)[0]

        out = self.compose(call, hidden_states, halves)
        return (out,) if not return_dict else transformer_output(out)


class EasyAnimate(DiffusersBackbone, InsideAccess):
    """EasyAnimate V5.1 (text → video) as a frozen backbone.

    >>> base = EasyAnimate.from_pretrained("/models/EasyAnimateV5.1-12b-zh-diffusers")   # bf16 on a GPU
    >>> batch = base.prepare_batch({"video": clips, "prompt": "a robot arm", "action": actions})
    >>> latents = base.generate({"prompt": "a robot arm", "frames": 49, "height": 512, "width": 512})

    ``prepare_batch`` takes ``"video"`` ``(B, 3, T, H, W)`` in [-1, 1] (or uint8 ``(B, T, H, W, 3)``)
    for training, or only the text plus ``"frames"`` / ``"height"`` / ``"width"`` (default: the
    card's) for generation; text as ``"prompt"`` (or ``prompt_key``), precomputed
    ``"prompt_embeds"`` (+ ``"prompt_attention_mask"``), or the config's default prompt; and the
    per-frame signals (see :meth:`DiffusersBackbone.prepare_batch`).
    """

    config_class = EasyAnimateConfig
    name = "easyanimate"
    model_name = "EasyAnimate"
    release = RELEASE
    convert = (f"download {RELEASE} (or the 7b one) instead, or load the upstream weights with diffusers' "
               f"EasyAnimate classes and write them with EasyAnimatePipeline.save_pretrained(DIR).")
    mode_fix = "For image-to-video use wan22_ti2v (first_frame: true)."
    real_defaults = REAL_DEFAULTS

    def tiny_pipeline(self) -> Path:
        from workbench_easyanimate.tiny import FIXTURE

        return FIXTURE.ensure()

    def real_config(self) -> Path:
        """The EasyAnimate V5.1 12B configuration shipped with the plugin (no weights; see its
        PROVENANCE.md)."""
        return Path(__file__).parent / "real"

    def load(self) -> torch.dtype:
        from diffusers import EasyAnimatePipeline

        c = self.config
        loaded, dtype = load_pipeline(self.folder, plugin=self.name, device=c.device, dtype=c.dtype,
                                      skip=("text_encoder",),
                                      random_weights=c.random_weights, seed=c.seed)
        parts = loaded.components
        latent_channels = parts["vae"].config.latent_channels
        if parts["transformer"].config.in_channels != latent_channels:
            raise CheckpointError(
                f"easyanimate: {self.folder} holds a transformer taking "
                f"{parts['transformer'].config.in_channels} input channels "
                f"for a {latent_channels}-channel VAE: an inpainting (-InP) or control (-Control) variant. "
                f"Only the text-to-video release is supported (input channels == latent channels), "
                f"e.g. {RELEASE}."
            )
        self.adopt_components(parts)
        self.pipeline = EasyAnimatePipeline(vae=self.vae, text_encoder=None,  # loaded on first use
                                            tokenizer=self.tokenizer, transformer=self.transformer,
                                            scheduler=self.scheduler)
        self.pipeline.set_progress_bar_config(disable=True)
        self.latent_channels = latent_channels
        self.spatial = self.vae.spatial_compression_ratio
        self.temporal = self.vae.temporal_compression_ratio
        self.patch = self.spatial_patch = self.transformer.config.patch_size
        self.scaling_factor = float(self.vae.config.scaling_factor)
        self.train_timesteps = self.scheduler.config.num_train_timesteps
        return dtype

    # -- card --------------------------------------------------------------------------------
    def card_fields(self) -> dict[str, Any]:
        return dict(
            model_id="easyanimate",
            family="easyanimate",
            sampler="flow_euler",
            shift=getattr(self.scheduler.config, "shift", None),
            capabilities=("t2v",),
            context_frames=0,  # text-to-video: no frame a rollout's next chunk could continue from
            notes="EasyAnimate V5.1 through diffusers' EasyAnimatePipeline: "
                  "MagViT VAE (8x spatial, 4x temporal), Qwen2-VL text encoder, MMDiT transformer; "
                  "guidance runs [uncond; cond] in one transformer call.",
        )

    def text_conditions(self) -> tuple[str, ...]:
        return ("prompt_embeds", "prompt_attention_mask", "negative_prompt_embeds",
                "negative_prompt_attention_mask")

    # -- autoencoder -------------------------------------------------------------------------
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] → latents ``(B, C, 1 + (T-1)/4, H/8, W/8)``
        (mode x scaling_factor)."""
        z = self.vae.encode(video.to(device=self.vae.device, dtype=self.vae.dtype)).latent_dist.mode()
        return z.float() * self.scaling_factor

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents → video ``(B, 3, T, H, W)`` in [-1, 1] (the pipeline's own ``1 / scaling_factor``)."""
        z = 1 / self.scaling_factor * latents.float()
        return self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0].float().clamp(-1, 1)

    # -- text --------------------------------------------------------------------------------
    def encode_text(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts → Qwen2-VL embeddings ``(B, L, D)`` and attention mask ``(B, L)``, through the
        pipeline's own ``encode_prompt`` and cached per prompt (the text encoder dwarfs any adapter)."""
        def encode(missing: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
            embeds, _, mask, _ = self.pipeline.encode_prompt(
                missing, do_classifier_free_guidance=False, device=self.device, dtype=self.transformer.dtype)
            return list(zip(embeds, mask))

        pairs = self.cached_text(prompts, encode, "Pass precomputed 'prompt_embeds' (B, L, D) and "
                                                  "'prompt_attention_mask' (B, L) in the batch instead.")
        return (torch.stack([e for e, _ in pairs]).to(self.device),
                torch.stack([m for _, m in pairs]).to(self.device))

    def _text(self, raw: Mapping[str, Any], batch_size: int) -> dict[str, torch.Tensor]:
        cond = {}
        width = self.transformer.config.text_embed_dim
        for prefix in ("", "negative_"):
            value = raw.get(f"{prefix}prompt_embeds")
            if value is None:
                continue
            value = torch.as_tensor(value)
            if value.ndim != 3 or value.shape[0] != batch_size or value.shape[2] != width:
                raise DataError(f"easyanimate: '{prefix}prompt_embeds' must be (B, L, {width}) "
                                f"with B={batch_size}, got {tuple(value.shape)}. "
                                f"Compute it with base.encode_text(prompts).")
            mask = raw.get(f"{prefix}prompt_attention_mask")
            mask = torch.ones(value.shape[:2], dtype=torch.long) if mask is None else torch.as_tensor(mask)
            cond[f"{prefix}prompt_embeds"] = value.to(device=self.device, dtype=self.transformer.dtype)
            cond[f"{prefix}prompt_attention_mask"] = mask.to(self.device)
        if "prompt_embeds" not in cond:
            c = self.config
            prompts = prompts_from(raw, c.prompt_key, c.prompt, c.prompt_template, batch_size, "easyanimate")
            cond["prompt_embeds"], cond["prompt_attention_mask"] = self.encode_text(prompts)
        return cond

    # -- denoising ---------------------------------------------------------------------------
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        """The frozen transformer's velocity at ``x_t`` (``t``: noise level in [0, 1], ``(B,)``).

        Inside ``generate`` this is (this half of) the pipeline's own call; elsewhere the same call
        is made here, with timestep ``1000 t``.
        """
        out = self.native_prediction(x_t)
        if out is None:
            if "prompt_embeds" not in cond:
                raise DataError("easyanimate.denoise needs cond['prompt_embeds'] (B, L, D) "
                                "from prepare_batch.")
            t = torch.as_tensor(t, device=x_t.device)
            t = t.expand(x_t.shape[0]) if t.ndim == 0 else t
            dtype = self.transformer.dtype
            out = self.transformer(x_t.to(dtype), (t.float() * self.train_timesteps).to(dtype),
                                   encoder_hidden_states=cond["prompt_embeds"].to(dtype),
                                   return_dict=False)[0]
        if out.shape[1] != self.latent_channels:  # a learned-variance head: the prediction is the first half
            out = out[:, : self.latent_channels]
        return out.to(x_t.dtype)

    text_encoder_note = "EasyAnimate V5.1's Qwen2-VL"

    def planning_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(t, cond)`` of the shapes :meth:`denoise` is called with for ``latents`` (zeros, on their
        device): the pipeline's 256 prompt tokens (its ``max_sequence_length``) of the text width.
        For memory plans."""
        width = self.transformer.config.text_embed_dim
        embeds = torch.zeros(latents.shape[0], 256, width, device=latents.device,
                             dtype=self.transformer.dtype)
        return self.planning_time(latents), {"prompt_embeds": embeds}

    # -- adapters inside the transformer -------------------------------------------------------
    def inside_spec(self) -> InsideSpec:
        """Where ``lora`` / ``action_modulation`` / ``controlnet`` reach: the video stream's attention
        projections (LoRA; the text stream's ``add_*_proj`` are left alone), and the MMDiT blocks
        (video tokens ``(B, T' h w, W)``, frame-major). Each block returns the video and the text
        hidden states, so a ControlNet's copied chain hands the text on from block to block as the
        transformer does."""
        tr = self.transformer
        width = tr.config.num_attention_heads * tr.config.attention_head_dim
        blocks = tuple(tr.transformer_blocks)
        return InsideSpec(root=tr, root_name="transformer",
                          lora_targets=("to_q", "to_k", "to_v", "to_out.0"), blocks=blocks,
                          widths=(width,) * len(blocks), branch_blocks=len(blocks), layout="tokens")

    # -- sampling ----------------------------------------------------------------------------
    def run_sampler(self, batch: Batch, *, steps: int, sampler: str, generator: torch.Generator | None,
                  compose_fn, on_step, guidance_scale: float | None = None,
                  **pipeline_kwargs) -> torch.Tensor:
        """Run the diffusers pipeline with the composition injected; returns its final latents.

        ``guidance_scale`` defaults to the card's; other keyword arguments go to the pipeline.
        """
        guidance = self.guidance_for(guidance_scale)
        b = batch.batch_size
        kwargs: dict[str, Any] = dict(prompt_embeds=batch.cond["prompt_embeds"],
                                      prompt_attention_mask=batch.cond["prompt_attention_mask"])
        uncond = None
        if guidance > 1:
            negative, mask = (batch.cond.get("negative_prompt_embeds"),
                              batch.cond.get("negative_prompt_attention_mask"))
            if negative is None:
                negative, mask = self.encode_text([self.config.negative_prompt] * b)
            kwargs.update(negative_prompt_embeds=negative, negative_prompt_attention_mask=mask)
            uncond = uncond_batch(batch, negative, prompt_attention_mask=mask)
        injection = _EasyAnimateInjection(self, batch, uncond, compose_fn, on_step, steps)
        return self.run_pipeline(self.pipeline, injection, batch, steps=steps, guidance=guidance,
                                 generator=generator, **kwargs, **pipeline_kwargs)
