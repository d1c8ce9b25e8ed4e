"""What a diffusers-native backbone needs around diffusers' own pipeline (no diffusers import here).

* :class:`Injection` (from :mod:`~workbench.backbones.diffusers_injection`) wraps the pipeline's
  transformer forward for one ``generate``, handing each call to the composition and the pipeline's
  own call to the backbone (its :attr:`~DiffusersBackbone.native_call`).
* :class:`DiffusersBackbone` and :class:`DiffusersConfig`: what every such backbone shares — the
  construction (``tiny`` fixture or a checked pipeline directory, the dtype, the frozen modules),
  the card, the flow-matching objective, the signal conditions it provides.
* Loading and data helpers shared by the plugins.

Every diffusers-native plugin builds on this module; it is part of workbench's public API for
plugin authors (``__all__``, including the data helpers of :mod:`~workbench.backbones.diffusers_data`
and the loading helpers of :mod:`~workbench.backbones.diffusers_loading`) and never imports
diffusers itself (``import workbench`` does not load it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from workbench.backbones.diffusers_data import (
    CONTROL_KEY,
    SIGNAL_CONDITIONS,
    SIGNAL_KEYS,
    add_signals,
    batch_size_of,
    check_video_size,
    pool_to_latent_frames,
    prompts_from,
    requested_frames,
    uncond_batch,
)
from workbench.backbones.diffusers_injection import Injection, NativeCallHandoff, transformer_output
from workbench.backbones.diffusers_loading import (
    PRECISION,
    TinyFixture,
    component_class,
    fixture_directory,
    load_component,
    load_pipeline,
    parameter_count,
    pipeline_directory,
    resolve_dtype,
)
from workbench.config import check, check_compile
from workbench.core import BaseVideoModel, Batch, ComponentSpec, FlowMatching, ModelCard, SamplingDefaults
from workbench.core.backbone import as_video, example_inputs, freeze
from workbench.core.capabilities import (
    CachesLatents,
    KeepsFloat32,
    LatentLayout,
    MemoryPlanning,
    SamplingOptions,
)
from workbench.core.platform import placement
from workbench.errors import CheckpointError, DataError


@dataclass
class DiffusersConfig:
    """What every diffusers-native backbone is configured with (plugins extend it).

    ``path``: a diffusers-format directory (``model_index.json``), ``"tiny"`` for a tiny
    random pipeline built once under the workbench cache (tests and examples), or ``"real"`` for
    the real model's configuration shipped with the plugin (no weights: needs ``random_weights``).
    ``random_weights``: build the directory's models from their ``config.json`` alone with random
    weights, each materialised once in the target dtype (rehearsals at real size, memory plans);
    ``seed`` picks the values.
    ``device``: where the weights load (``auto``: the best visible device); ``dtype``: ``auto`` =
    the card's precision on that device, bf16 on a GPU that has it, else float32.
    ``prompt_key``: the raw-batch key holding prompts (``task`` for Meta-World clips), each put
    into ``prompt_template`` (e.g. ``"a robot arm doing the {} task"``);
    ``prompt``: the prompt for batches without one. ``negative_prompt``: the guidance prompt.
    ``steps`` / ``guidance_scale`` / ``height`` / ``width`` / ``num_frames`` / ``fps``: sampling
    defaults for the card; ``None`` keeps the real model's. ``compile``: run the transformer through
    ``torch.compile`` (:meth:`~workbench.core.backbone.BaseVideoModel.compile`).
    """

    path: str
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    random_weights: bool = False
    seed: int = 0
    prompt_key: str = "prompt"
    prompt_template: str = "{}"
    prompt: str | None = None
    negative_prompt: str = ""
    steps: int | None = None
    guidance_scale: float | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    compile: bool = False

    def __post_init__(self):
        check_compile(self.compile)
        check("{}" in self.prompt_template, "prompt_template",
              f"must contain '{{}}' where the batch's prompt goes, got {self.prompt_template!r}.")
        check(bool(self.path), "path",
              "is empty; give a diffusers-format directory (with model_index.json) or 'tiny'.")
        check(self.steps is None or self.steps >= 1, "steps", f"must be >= 1 or null, got {self.steps}.")
        check(self.guidance_scale is None or self.guidance_scale >= 0, "guidance_scale",
              f"must be >= 0 or null, got {self.guidance_scale}.")
        for name in ("height", "width", "num_frames", "fps"):
            value = getattr(self, name)
            check(value is None or value >= 1, name, f"must be a positive int or null, got {value}.")


class DiffusersBackbone(BaseVideoModel, SamplingOptions, LatentLayout, CachesLatents, MemoryPlanning,
                        KeepsFloat32):
    """What the diffusers-native backbones share: construction, the pipeline's modules, the card,
    the flow-matching objective, the signal conditions, and a lazily evaluated base call inside
    ``generate``.

    A plugin sets ``name`` (its registry name) and ``model_name`` (the model, in messages),
    ``release`` (the diffusers-format release to point users at), ``convert`` (how to get one from
    an upstream checkpoint), ``real_defaults`` (the real model's sampling settings) and
    ``config_class`` (a :class:`DiffusersConfig`); implements :meth:`tiny_pipeline`, :meth:`load`
    (load the pipeline's parts with :func:`load_pipeline`, check them, :meth:`adopt_components`, build the
    pipelines, set
    ``latent_channels``, ``spatial`` / ``temporal`` compression and ``spatial_patch``),
    :meth:`card_fields`, ``_text`` (the text conditions of a raw batch), ``denoise``,
    ``run_sampler`` (through :meth:`run_pipeline`) and ``planning_inputs`` (the bridge declares
    :class:`~workbench.core.capabilities.MemoryPlanning`); declares
    :class:`~workbench.core.capabilities.InsideAccess` with its ``inside_spec``; and overrides
    :meth:`latents_from`, :meth:`condition_on` / :meth:`batch_from` where its inputs go beyond clips
    and text.

    **The text encoder loads when first needed** (:attr:`text_encoder`): :func:`load_pipeline` is
    called with ``skip=("text_encoder",)`` and the pipelines are built with ``text_encoder=None``;
    prompts met for the first time load it. A batch that carries its text embeddings (a latent
    cache, see :meth:`encode_item`) never does, so a training rank fed from a cache holds the
    transformer and the VAE only. The text encoder is not a submodule of the backbone: its
    weights are not in ``state_dict()`` (the config's ``path`` names them), whether loaded or not.

    **Frozen encoders run clip by clip** (the VAE in :meth:`latents_from`, the text encoder prompt by
    prompt), so a clip's encoding never depends on the batch it came in: a latent cache equals
    encoding on the fly, bit for bit.
    """

    name: str = ""
    model_name: str = ""
    convert: str = ""
    real_defaults: Mapping[str, Any] = {}
    mode_fix: str = ""  # how to get a backbone of another mode, said when a request is refused
    # the video VAEs diffusers ships are causal in time: frame 0 → latent 0, then r per frame
    causal_latents = True
    # components loaded and kept in float32 whatever the dtype (a VAE)
    float32_components: tuple[str, ...] = ()

    native_call: NativeCallHandoff
    """Where an :class:`Injection` hands this backbone the pipeline's own transformer call inside
    ``generate`` (:meth:`native_prediction` answers from it)."""

    forward_version: int = 0
    """Bumped by whatever changes what :meth:`denoise` computes for the same input without touching
    the weights (an inside adapter's switches): the pipeline's own transformer call, cached during
    one sampler call, is reused only at the version it was made."""

    pipelines: Mapping[str, Any] | None = None
    """The diffusers pipelines this backbone drives, by mode. ``exp.export_lora`` writes a LoRA in
    that pipeline class's own format (so ``pipe.load_lora_weights`` reads it)."""

    def __init__(self, config: DiffusersConfig | None = None, **overrides):
        super().__init__()
        self.native_call = NativeCallHandoff()
        self.config = config = self.config_from(config, overrides)
        if config.path == "tiny":
            self.folder = self.tiny_pipeline()
        elif config.path == "real":
            if not config.random_weights:
                raise CheckpointError(
                    f"{self.name}: path 'real' is the real {self.model_name} configuration "
                    f"shipped with the plugin, without weights. "
                    f"Set random_weights: true to build it with random weights (a rehearsal or a "
                    f"memory plan), or point path at a downloaded release ({self.release}).")
            self.folder = self.real_config()
        else:
            self.folder = pipeline_directory(config.path, self.name, self.release, self.convert)
        self.__dict__.setdefault("_text_encoder", None)  # loaded on first use, never a submodule (see above)
        dtype = self.load()
        self._text_cache: dict[str, Any] = {}
        self.card = self.make_card(dtype)
        if config.compile:
            self.compile()

    @classmethod
    def from_config(cls, config: DiffusersConfig) -> DiffusersBackbone:
        return cls(config)

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides) -> DiffusersBackbone:
        """Load a diffusers-format directory (``model_index.json``); ``overrides``: the config's fields."""
        return cls(cls.config_class(path=str(path), **overrides))

    def tiny_pipeline(self) -> Path:
        """The directory of this plugin's tiny random pipeline (``path: tiny``), written once."""
        raise NotImplementedError

    def real_config(self) -> Path:
        """The directory of the real model's configuration files shipped with the plugin (``path: real``)."""
        raise CheckpointError(f"{self.name}: this plugin ships no real configuration; "
                              f"point path at a release.")

    def weight_files(self) -> tuple[Path, ...]:
        """Every file of the pipeline directory that is not hidden (a download's ``.cache/`` is), the
        text encoder's included whether loaded or not; ``()`` with ``random_weights`` (none is read)."""
        if self.config.random_weights:
            return ()
        found = []
        for parent, dirs, files in os.walk(self.folder, followlinks=True):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found += [Path(parent) / name for name in files if not name.startswith(".")]
        return tuple(sorted(found))

    def load(self) -> torch.dtype:
        """Load the pipeline from ``self.folder`` onto the config's device in its dtype (see
        :func:`load_pipeline`), check it, adopt its modules, build the pipelines; return the dtype."""
        raise NotImplementedError

    def adopt_components(self, parts: Mapping[str, Any]) -> None:
        """Own the loaded pipeline's modules (frozen, in eval mode, moved and counted with the backbone).

        ``transformer``, ``vae`` and ``scheduler`` are required, ``tokenizer`` optional (precomputed
        embeddings); a ``text_encoder`` given here is used instead of loading it on first need.
        Pipelines built over them afterwards only borrow them.
        """
        self.transformer = parts["transformer"]
        self.vae = parts["vae"]
        self.tokenizer = parts.get("tokenizer")
        self.scheduler = parts["scheduler"]
        for module in (self.transformer, self.vae):
            module.eval()
        if parts.get("text_encoder") is not None:
            self._adopt_text_encoder(parts["text_encoder"])

    # -- the text encoder, loaded on first use ---------------------------------------------------
    @property
    def text_encoder(self):
        """The text encoder, loaded from the pipeline directory (onto the backbone's device, in its dtype)
        the first time it is asked for; ``None`` when the pipeline has none."""
        module = self.__dict__.get("_text_encoder")
        if module is None and self.has_text_encoder:
            module = load_component(self.folder, "text_encoder", device=self.device, dtype=self.dtype)
            self._adopt_text_encoder(module)
        return module

    @property
    def has_text_encoder(self) -> bool:
        """Whether the pipeline has a text encoder (loaded or not)."""
        loaded = self.__dict__.get("_text_encoder") is not None
        return loaded or component_class(self.folder, "text_encoder") is not None

    @property
    def text_encoder_loaded(self) -> bool:
        """Whether the text encoder is in memory (a run fed its text embeddings never loads it)."""
        return self.__dict__.get("_text_encoder") is not None

    def _adopt_text_encoder(self, module) -> None:
        freeze(module)
        self.__dict__["_text_encoder"] = module
        for pipe in self.borrowers():
            pipe.register_modules(text_encoder=module)

    def borrowers(self) -> list:
        """The pipelines built over this backbone's modules
        (:attr:`pipelines`, and a ``pipeline`` attribute)."""
        found = list((self.pipelines or {}).values())
        single = self.__dict__.get("pipeline")
        return found + ([single] if single is not None and single not in found else [])

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        module = self.__dict__.get("_text_encoder")
        if module is not None and recurse:  # not a submodule, but it goes where the backbone goes
            module._apply(fn)
        return out

    def keep_in_float32(self) -> tuple[str, ...]:
        """What a reduced-precision load keeps in float32: :attr:`float32_components` whole, and in every
        diffusers model the parameters its class's ``_keep_in_fp32_modules`` names (diffusers' own rule: a
        parameter whose dotted path has one of those names as a part), so ``.to(torch.bfloat16)`` makes
        the backbone a bf16 load makes."""
        paths = list(self.float32_components)
        for name in ("transformer", "vae", "text_encoder"):
            module = self.__dict__.get("_modules", {}).get(name)
            keep = getattr(type(module), "_keep_in_fp32_modules", None) or ()
            if module is None or not keep or name in self.float32_components:
                continue
            # transformers keeps them for float16 only
            if not type(module).__module__.startswith("diffusers."):
                continue
            paths += [f"{name}.{p}" for p, _ in module.named_parameters()
                      if any(k in p.split(".") for k in keep)]
        return tuple(paths)

    # -- card --------------------------------------------------------------------------------
    def make_card(self, dtype: torch.dtype) -> ModelCard:
        """The card: :meth:`card_fields` plus what every diffusers backbone shares (components with
        their sources and sizes, the config's sampling defaults over :attr:`real_defaults`, precision)."""
        c = self.config
        fields = self.card_fields()
        source = "tiny random pipeline" if c.path == "tiny" else str(self.folder)
        if c.random_weights:
            source = f"random weights (seed {c.seed}) on the configuration {source}"
        weights = str(dtype).replace("torch.", "")

        def spec(kind: str, module, sub: str, dtype_name: str | None = weights) -> ComponentSpec:
            count = (sum(p.numel() for p in module.parameters()) if isinstance(module, torch.nn.Module)
                     else None)
            return ComponentSpec(kind, f"{source}/{sub}", dtype_name if count is not None else None, count)

        components = {"transformer": spec("denoiser", self.transformer, "transformer"),
                      "vae": spec("vae", self.vae, "vae", fields.pop("vae_dtype", weights)),
                      "scheduler": spec("scheduler", None, "scheduler")}
        if self.has_text_encoder:  # counted from its files: it loads when first needed
            count = parameter_count(self.folder, "text_encoder")
            components["text_encoder"] = ComponentSpec("text_encoder", f"{source}/text_encoder", weights,
                                                       count)
        if self.tokenizer is not None:
            components["tokenizer"] = spec("tokenizer", None, "tokenizer")
        defaults = {k: getattr(c, k) if getattr(c, k) is not None else v
                    for k, v in self.real_defaults.items()}
        shift, sampler = fields.pop("shift"), fields.pop("sampler")
        return ModelCard(
            model_id=f"{fields.pop('model_id')}:{Path(self.folder).name}",
            prediction_type="velocity",
            components=components,
            sampling=SamplingDefaults(sampler=sampler, shift=float(shift) if shift else None, **defaults),
            precision=dict(PRECISION),
            samplers=(sampler,),
            **fields,
        )

    def card_fields(self) -> dict[str, Any]:
        """What only this backbone's card says: ``model_id`` (the prefix before the folder name),
        ``family``, ``sampler``, ``shift``, ``capabilities``, ``notes`` and optionally ``vae_dtype``."""
        raise NotImplementedError

    def default_objective(self):
        return FlowMatching(shift=self.card.sampling.shift or 1.0)

    def text_conditions(self) -> tuple[str, ...]:
        """The text (and image) conditions :meth:`prepare_batch` supplies, before the signals."""
        return ("prompt_embeds", "negative_prompt_embeds")

    def latent_frames(self, frames: int) -> int:
        """The causal video VAE's latent frames: the first frame, then one per ``temporal`` frames."""
        return 1 + (int(frames) - 1) // self.temporal

    # -- memory plans ------------------------------------------------------------------------
    def latent_shape(self, clip) -> tuple[int, ...]:
        """``(C, T', h, w)`` of one clip: the VAE's channels, latent frames and spatial compression."""
        return (self.latent_channels, self.latent_frames(clip.frames), clip.height // self.spatial,
                clip.width // self.spatial)

    def planning_time(self, latents: torch.Tensor) -> torch.Tensor:
        """A flow-matching time in the middle of the schedule, one per clip of ``latents``."""
        return torch.full((latents.shape[0],), 0.5, device=latents.device)

    text_encoder_note: str = ""
    """The released text encoder's size, in words, for a memory plan of a configuration without it."""

    def planning_notes(self) -> tuple[str, ...]:
        if self.has_text_encoder:
            return ()
        known = f" ({self.text_encoder_note})" if self.text_encoder_note else ""
        return (f"the text encoder is not in this configuration and not counted{known}; "
                f"a run fed precomputed prompt_embeds (a latent cache) never loads it",)

    def provides(self) -> tuple[str, ...]:
        return (*self.text_conditions(), *SIGNAL_CONDITIONS)

    # -- batches -----------------------------------------------------------------------------
    def check_frames(self, shape: Sequence[int], key: str) -> None:
        """``(T, H, W)`` of ``key`` fits the VAE and the patching (see :func:`check_video_size`)."""
        d = self.real_defaults
        check_video_size(shape, key, plugin=self.name, model=self.model_name, temporal=self.temporal,
                         spatial=self.spatial, patch=self.spatial_patch, max_frames=d["num_frames"],
                         example=f"{d['num_frames']} frames at {d['height']}x{d['width']}")

    def blank_latents(self, batch_size: int, frames: int, height: int, width: int, key: str) -> torch.Tensor:
        """Zero latents ``(B, C, T', h, w)`` for a generation request of that size (checked first)."""
        self.check_frames((frames, height, width), key)
        shape = (batch_size, self.latent_channels, (frames - 1) // self.temporal + 1, height // self.spatial,
                 width // self.spatial)
        return torch.zeros(shape, device=self.device)

    def encode_clips(self, video: torch.Tensor) -> torch.Tensor:
        """:meth:`encode` of each clip of ``video`` on its own, joined: a clip's latents never depend on the
        batch it came in (the VAE's kernels need not be batch-invariant), as :meth:`encode_item`
        makes them."""
        return torch.cat([self.encode(video[i:i + 1]) for i in range(video.shape[0])])

    def latents_from(self, raw: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """``(latents, video, has_target)`` of a raw batch: its ``"video"`` encoded clip by clip, its
        ``"latents"`` as given (a latent cache's, see :meth:`encode_item`), or else zero latents of the size a
        text-to-video request asks for (``"frames"`` or the signals' length, ``"height"`` / ``"width"``,
        default the card's; ``video`` is then ``None``)."""
        if "latents" in raw:
            return self.given_latents(raw["latents"]), None, True
        if "video" in raw:
            video = as_video(raw["video"], "video").to(self.device)
            self.check_frames(video.shape[2:], "video")
            return self.encode_clips(video), video, True
        batch_size = batch_size_of(raw, self.config.prompt_key)
        frames, s = self.frames_requested(raw), self.card.sampling
        height, width = int(raw.get("height", s.height)), int(raw.get("width", s.width))
        return self.blank_latents(batch_size, frames, height, width, "generation size"), None, False

    def given_latents(self, value: Any) -> torch.Tensor:
        """A raw batch's ``"latents"`` (as :meth:`encode` returns them)
        checked and on the backbone's device."""
        latents = torch.as_tensor(value)
        want = (self.latent_channels, None, None, None)
        if latents.ndim != 5 or latents.shape[1] != want[0] or not latents.is_floating_point():
            raise DataError(f"{self.name}: 'latents' must be float (B, {self.latent_channels}, T', h, w) "
                            f"as encode() returns them (a latent cache's), "
                            f"got {tuple(latents.shape)} {latents.dtype}. "
                            f"Pass 'video' instead to have them encoded.")
        return latents.to(self.device)

    def encode_item(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """One dataset item with the frozen encoders' work done: ``"video"`` → ``"latents"``
        ``(C, T', h, w)``, its text → the text conditions (``prompt_embeds`` ...), and what
        :meth:`condition_on` derives from the clip (e.g. the first frame's latent); everything else kept.
        ``prepare_batch`` of collated items is then ``prepare_batch`` of the collated raw items, bit for bit,
        without the VAE encoder or the text encoder. ``None`` for an item without ``"video"``."""
        if "video" not in item:
            return None
        raw = {k: v for k, v in item.items() if k != "video"}
        video = as_video(torch.as_tensor(item["video"])[None], "video").to(self.device)
        self.check_frames(video.shape[2:], "video")
        with torch.no_grad():
            latents = self.encode_clips(video)
            # the item as a batch of one: its prompt, and its own text embeddings if it carries them
            one = {k: [v] if isinstance(v, str) else v[None] if isinstance(v, torch.Tensor) else v
                   for k, v in raw.items()}
            cond: dict[str, Any] = self._text(one, 1)
            self.condition_on(cond, latents, video, True)
            extra = self.cached_conditions(video)
        out = {**raw, "latents": latents[0].cpu()}
        out.update({k: v[0].cpu() for k, v in {**cond, **extra}.items() if isinstance(v, torch.Tensor)})
        return out

    def cached_conditions(self, video: torch.Tensor) -> dict[str, torch.Tensor]:
        """What a cached item keeps of its clip besides the conditions
        (e.g. a sampler's first-frame pixels)."""
        return {}

    def prepare_batch(self, raw: Mapping[str, Any] | Batch) -> Batch:
        """Raw data → :class:`Batch`: the latents (:meth:`latents_from`), the text conditions, what the
        backbone conditions on besides (:meth:`condition_on`), then each per-frame signal (``"action"`` or
        ``"actions"``, ``"proprio"``, ``"ee_pos"`` ``(B, T, D)``) pooled onto latent frames (``action``
        ``(B, T', D)``) and at full rate (``action_frames``), see :func:`add_signals`. Collated items of
        :meth:`encode_item` (``"latents"`` and the text conditions instead of ``"video"`` and text) give
        the batch their raw items give."""
        if isinstance(raw, Batch):
            return raw
        if not isinstance(raw, Mapping):
            raise DataError(f"{self.name}.prepare_batch expects a mapping of tensors, "
                            f"got {type(raw).__name__}.")
        text_keys = ("prompt", "prompt_embeds", self.config.prompt_key)
        self.card.check_request(raw, backbone=self.name, text_keys=text_keys, fix=self.mode_fix)
        with torch.no_grad():
            latents, video, has_target = self.latents_from(raw)
            cond: dict[str, Any] = self._text(raw, latents.shape[0])
            self.condition_on(cond, latents, video, has_target, raw=raw)
        batch_size, frames = latents.shape[0], 1 + (latents.shape[2] - 1) * self.temporal
        per_frame = add_signals(cond, raw, batch_size=batch_size, frames=frames, ratio=self.temporal,
                                device=self.device, plugin=self.name)
        return self.batch_from(latents, cond, frozenset(per_frame), video, has_target, raw=raw)

    def condition_on(self, cond: dict[str, Any], latents: torch.Tensor, video: torch.Tensor | None,
                     has_target: bool, raw: Mapping[str, Any] | None = None) -> None:
        """Add to ``cond`` what the backbone conditions on besides text (e.g. a first frame), from ``video``
        or, for cached items (``video`` ``None``), from ``raw``; nothing by default."""

    def batch_from(self, latents: torch.Tensor, cond: dict[str, Any], per_frame: frozenset[str],
                   video: torch.Tensor | None, has_target: bool,
                   raw: Mapping[str, Any] | None = None) -> Batch:
        """The prepared :class:`Batch` (every latent frame predicted unless a backbone says otherwise)."""
        return Batch(latents=latents, cond=cond, per_frame=per_frame, meta={"has_target": has_target})

    def _text(self, raw: Mapping[str, Any], batch_size: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def cached_text(self, prompts: Sequence[str], encode: Callable[[list[str]], Sequence[Any]],
                    fix: str) -> list[Any]:
        """Each prompt's encoding: a prompt not seen before is encoded on its own, once per backbone
        (``encode([prompt])`` gives one entry), and kept — the text encoder dwarfs any adapter.
        ``fix``: what to pass instead when the pipeline has no text encoder."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._text_cache]
        if missing:
            if not self.has_text_encoder or self.tokenizer is None:
                raise DataError(f"{self.name}: prompts were given but "
                                f"{self.folder} has no text_encoder / tokenizer. "
                                f"{fix}")
            self.text_encoder  # noqa: B018 (loads it on first need, into the pipelines too)
            with torch.no_grad():
                for prompt in missing:  # one by one: an embedding never depends on the prompts beside it
                    self._text_cache[prompt] = encode([prompt])[0]
        return [self._text_cache[p] for p in prompts]

    # -- sampling ----------------------------------------------------------------------------
    def guidance_for(self, guidance_scale: float | None = None) -> float:
        """The classifier-free guidance scale a ``generate`` call uses: the card's unless given."""
        return self.card.sampling.guidance_scale if guidance_scale is None else guidance_scale

    def predictions_per_step(self, batch: Batch, guidance_scale: float | None = None,
                             **sampler_kwargs: Any) -> int:
        """Two under classifier-free guidance (a diffusers pipeline guides when the scale is over 1:
        the conditional and the unconditional half each go through ``compose_fn``), else one."""
        return 2 if self.guidance_for(guidance_scale) > 1 else 1

    def run_pipeline(self, pipe: Any, injection: Injection, batch: Batch, *, steps: int, guidance: float,
                     generator: torch.Generator | None, **kwargs: Any) -> torch.Tensor:
        """Run ``pipe`` for ``batch``'s size with ``injection`` installed;
        its final latents in the batch's dtype."""
        _, _, frames, h, w = batch.latents.shape
        with injection.installed(pipe):
            out = pipe(height=h * self.spatial, width=w * self.spatial,
                       num_frames=1 + (frames - 1) * self.temporal, num_inference_steps=steps,
                       guidance_scale=guidance, generator=generator, output_type="latent",
                       **injection.callback, **kwargs)
        return out.frames.to(batch.latents.dtype)

    def native_prediction(self, x_t: torch.Tensor) -> torch.Tensor | None:
        """The pipeline's own transformer output for ``x_t``
        when ``x_t`` is what the injected call handed out."""
        return self.native_call.output_for(x_t)

    def frames_requested(self, raw: Mapping[str, Any]) -> int:
        """The frames a generation request asks for: its per-frame signals' length, else the card's."""
        return requested_frames(raw, self.card.sampling.num_frames)

    def example_batch(self, batch_size: int = 2, *,
                      generator: torch.Generator | None = None) -> dict[str, Any]:
        """Video, the per-frame signals, a control video and a prompt at the clip's size, plus the guidance
        prompt's embeddings where the backbone provides them as a condition."""
        raw: dict[str, Any] = example_inputs(self.clip(), batch_size, generator=generator,
                                             per_frame={"action": 4, "proprio": 3, "ee_pos": 3})
        raw["prompt"] = self.config.prompt or "a robot arm pushes a puck"
        if "negative_prompt_embeds" in self.provides():
            negative = self.encode_text([self.config.negative_prompt] * batch_size)
            if isinstance(negative, tuple):  # embeddings and their attention mask
                raw["negative_prompt_embeds"], raw["negative_prompt_attention_mask"] = negative
            else:
                raw["negative_prompt_embeds"] = negative
        return raw


__all__ = [
    "CONTROL_KEY", "SIGNAL_CONDITIONS", "SIGNAL_KEYS", "DiffusersBackbone", "DiffusersConfig", "Injection",
    "TinyFixture", "add_signals", "as_video", "batch_size_of", "check_video_size", "example_inputs",
    "fixture_directory", "pipeline_directory", "load_pipeline", "placement", "pool_to_latent_frames",
    "prompts_from", "requested_frames", "resolve_dtype", "transformer_output", "uncond_batch",
]
