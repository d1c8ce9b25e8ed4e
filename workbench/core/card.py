"""ModelCard: what a backbone is, where its weights come from, and how it must be sampled.

A card is validated when it is built, so a wrong card fails before any compute. The recipe
may assume a sampler: a model distilled for 4 steps refuses a 50-step request with a
:class:`~workbench.errors.SamplerMismatchError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.core.platform import DEVICE_TYPES, preferences
from workbench.errors import CapabilityError, CardError, SamplerMismatchError, did_you_mean, listing

PREDICTION_TYPES = ("eps", "v", "x0", "velocity")
CAPABILITIES = ("t2v", "i2v", "ti2v", "v2v", "t2i", "action")
DTYPES = ("float32", "bfloat16", "float16")
MODE_NAMES = {"t2v": "text-to-video", "i2v": "image-to-video", "ti2v": "text+image-to-video",
              "v2v": "video-to-video", "t2i": "text-to-image", "action": "action-conditioned"}
TEXT_MODES = ("t2v", "ti2v", "t2i")  # modes that read a prompt
IMAGE_MODES = ("i2v", "ti2v")  # modes that generate from a given first frame
COMPONENT_KINDS = ("denoiser", "vae", "text_encoder", "image_encoder", "tokenizer", "scheduler", "other")


@dataclass(frozen=True)
class ComponentSpec:
    """One part of a backbone and where its weights come from.

    ``source`` is a path, a diffusers repo id, ``"random"`` for an untrained init, or
    ``"package:<file>"`` for weights shipped inside a Python package.
    """

    kind: str
    source: str = "random"
    dtype: str | None = None
    parameters: int | None = None


@dataclass(frozen=True)
class SamplingDefaults:
    """The model's own sampling settings, used whenever a request leaves one out."""

    steps: int = 50
    sampler: str = "euler"
    guidance_scale: float | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    shift: float | None = None


@dataclass(frozen=True)
class ClipSpec:
    """The clip a backbone predicts, as its card's sampling defaults say
    (see :meth:`~workbench.core.backbone.BaseVideoModel.clip`).

    ``frames`` pixel frames of ``height`` x ``width`` at ``fps`` frames per second (``None``:
    not stated), which :meth:`~workbench.core.backbone.BaseVideoModel.encode` turns into
    ``latent_frames`` latent frames. Every command that makes or reads clips for a backbone
    (evaluation, the demo, latent caches, dataset resizing) asks this, never a backbone's own
    config fields.
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


@dataclass(frozen=True)
class RecipeSpec:
    """How the weights were made and what that implies for serving them.

    ``assumes_steps`` / ``assumes_sampler``: set for distilled models that only work with
    that schedule. ``trained_on`` / ``train_steps`` / ``val_loss`` document provenance.
    """

    method: str = "base"
    trained_on: str = ""
    train_steps: int | None = None
    val_loss: float | None = None
    assumes_steps: int | None = None
    assumes_sampler: str | None = None


@dataclass(frozen=True)
class ModelCard:
    """A validated description of a backbone.

    ``precision``: per device type (``cpu`` / ``cuda`` / ``mps``) the dtype to run in, or a list
    of them best first (e.g. ``{"cuda": ("bfloat16", "float16")}``); ``dtype: auto`` takes the
    first one the device supports (:mod:`workbench.core.platform`), float32 when none is named.
    ``capabilities``: what the model can do; ``mode``: which of them this backbone, as built,
    serves (default: the only capability). :meth:`check_request` refuses what the mode cannot serve.
    ``context_frames``: how many frames a prediction continues from when it is chained into a
    rollout (:func:`workbench.inspect.rollout`): the last ``context_frames`` frames the previous
    chunk produced become the next chunk's image condition. 1 for an image-to-video model; 0 for
    a mode that takes no frame it could continue from (text-to-video, or an interpolation mode
    that also needs a future frame), which rollouts refuse.

    Examples:
        >>> card = ModelCard(model_id="tiny", family="tiny_video", prediction_type="velocity",
        ...                  components={"denoiser": ComponentSpec("denoiser")},
        ...                  capabilities=("i2v",))
        >>> card.mode                      # the only capability
    """

    model_id: str
    family: str
    prediction_type: str
    components: dict[str, ComponentSpec] = field(default_factory=dict)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    precision: dict[str, str | tuple[str, ...]] = field(
        default_factory=lambda: {"cpu": "float32", "cuda": "float32"})
    capabilities: tuple[str, ...] = ()
    mode: str | None = None
    recipe: RecipeSpec = field(default_factory=RecipeSpec)
    samplers: tuple[str, ...] = ("euler",)
    notes: str = ""
    context_frames: int = 1

    def __post_init__(self) -> None:
        errors = self.problems()
        if errors:
            raise CardError(
                f"ModelCard {self.model_id!r} is invalid ({len(errors)} problem"
                f"{'s' if len(errors) != 1 else ''}):\n  - " + "\n  - ".join(errors)
            )

    def problems(self) -> list[str]:
        errs: list[str] = []
        if not self.model_id:
            errs.append("model_id is empty; give the card a name.")
        if self.prediction_type not in PREDICTION_TYPES:
            errs.append(f"prediction_type={self.prediction_type!r}; allowed: {listing(PREDICTION_TYPES)}."
                        f"{did_you_mean(self.prediction_type, PREDICTION_TYPES)}")
        if not self.components:
            errs.append("components is empty; declare at least the denoiser and where its weights come from.")
        for name, comp in self.components.items():
            if not isinstance(comp, ComponentSpec):
                errs.append(f"components[{name!r}] must be a ComponentSpec, got {type(comp).__name__}.")
                continue
            if comp.kind not in COMPONENT_KINDS:
                errs.append(f"components[{name!r}].kind={comp.kind!r}; allowed: {listing(COMPONENT_KINDS)}."
                            f"{did_you_mean(comp.kind, COMPONENT_KINDS)}")
            if not comp.source:
                errs.append(f"components[{name!r}].source is empty; say where its weights come from "
                            f"(a path, a repo id, 'random', or 'package:<file>').")
            if comp.dtype is not None and comp.dtype not in DTYPES:
                errs.append(f"components[{name!r}].dtype={comp.dtype!r}; allowed: {listing(DTYPES)}.")
        for cap in self.capabilities:
            if cap not in CAPABILITIES:
                errs.append(f"capability {cap!r} is unknown; allowed: {listing(CAPABILITIES)}."
                            f"{did_you_mean(cap, CAPABILITIES)}")
        if self.mode is not None and self.mode not in self.capabilities:
            errs.append(f"mode={self.mode!r} is not one of the card's capabilities "
                        f"{listing(self.capabilities)}.")
        for device, choice in self.precision.items():
            if device not in DEVICE_TYPES:
                errs.append(f"precision has a key {device!r}, not a device type; "
                            f"allowed: {listing(DEVICE_TYPES)}."
                            f"{did_you_mean(device, DEVICE_TYPES)}")
            names = (choice,) if isinstance(choice, str) else choice
            if not isinstance(names, (tuple, list)) or not names:
                errs.append(f"precision[{device!r}]={choice!r}; "
                            f"give a dtype or a non-empty list of them, best first.")
                continue
            for dtype in names:
                if dtype not in DTYPES:
                    errs.append(f"precision[{device!r}]={dtype!r}; allowed: {listing(DTYPES)}.")
        s = self.sampling
        if not isinstance(s.steps, int) or s.steps < 1:
            errs.append(f"sampling.steps={s.steps!r}; must be a positive int.")
        if not self.samplers:
            errs.append("samplers is empty; name the native sampler(s) generate() runs.")
        elif s.sampler not in self.samplers:
            errs.append(f"sampling.sampler={s.sampler!r} is not one of the card's samplers "
                        f"{listing(self.samplers)}.")
        for name in ("height", "width", "num_frames", "fps"):
            value = getattr(s, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                errs.append(f"sampling.{name}={value!r}; must be a positive int or None.")
        if s.shift is not None and s.shift <= 0:
            errs.append(f"sampling.shift={s.shift!r}; must be > 0 or None.")
        if s.guidance_scale is not None and s.guidance_scale < 0:
            errs.append(f"sampling.guidance_scale={s.guidance_scale!r}; must be >= 0 or None.")
        if (isinstance(self.context_frames, bool) or not isinstance(self.context_frames, int)
                or self.context_frames < 0):
            errs.append(f"context_frames={self.context_frames!r}; must be an int >= 0 "
                        f"(1: a rollout continues from the last frame; "
                        f"0: this mode cannot continue from a frame).")
        elif s.num_frames is not None and self.context_frames >= s.num_frames:
            errs.append(f"context_frames={self.context_frames} leaves no new frame in a clip of "
                        f"sampling.num_frames={s.num_frames}; it must be smaller.")
        r = self.recipe
        if r.assumes_steps is not None:
            if not isinstance(r.assumes_steps, int) or r.assumes_steps < 1:
                errs.append(f"recipe.assumes_steps={r.assumes_steps!r}; must be a positive int or None.")
            elif s.steps != r.assumes_steps:
                errs.append(f"sampling.steps={s.steps} contradicts recipe.assumes_steps={r.assumes_steps}: "
                            f"the default request would be refused. Set sampling.steps={r.assumes_steps}.")
        if r.assumes_sampler is not None and r.assumes_sampler not in self.samplers:
            errs.append(f"recipe.assumes_sampler={r.assumes_sampler!r} is not a sampler this card runs "
                        f"({listing(self.samplers)}).")
        return errs

    def resolve_steps(self, steps: int | None, sampler: str | None = None) -> tuple[int, str]:
        """Fill a request from the defaults and check it against what the recipe assumes."""
        steps = self.sampling.steps if steps is None else steps
        sampler = self.sampling.sampler if sampler is None else sampler
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise SamplerMismatchError(f"steps={steps!r} for {self.model_id!r}; must be a positive int.")
        if sampler not in self.samplers:
            raise SamplerMismatchError(
                f"Sampler {sampler!r} requested for {self.model_id!r}, which runs {listing(self.samplers)}."
                f"{did_you_mean(sampler, self.samplers)}"
            )
        r = self.recipe
        if r.assumes_steps is not None and steps != r.assumes_steps:
            raise SamplerMismatchError(
                f"{self.model_id!r} was made with recipe {r.method!r} for exactly {r.assumes_steps} "
                f"sampling steps; {steps} were requested. Its weights give wrong results on any other "
                f"schedule. Use steps={r.assumes_steps} (or leave steps unset)."
            )
        if r.assumes_sampler is not None and sampler != r.assumes_sampler:
            raise SamplerMismatchError(
                f"{self.model_id!r} assumes the {r.assumes_sampler!r} sampler (recipe {r.method!r}); "
                f"{sampler!r} was requested. Use sampler={r.assumes_sampler!r}."
            )
        return steps, sampler

    def dtype_for(self, device_type: str) -> str:
        """The dtype the card prefers on ``device_type`` (``cpu`` / ``cuda`` / ``mps``); float32 if it
        names none.

        :func:`workbench.core.platform.resolve_dtype` picks the first of the preferences the
        device supports; this is the first preference.
        """
        return preferences(self.precision, device_type)[0]

    @property
    def serving(self) -> str | None:
        """The mode this backbone serves: ``mode``, else the only capability (``None`` if ambiguous)."""
        if self.mode is not None:
            return self.mode
        return self.capabilities[0] if len(self.capabilities) == 1 else None

    def check_request(self, raw: Mapping[str, Any], *, backbone: str, text_keys: Sequence[str] = ("prompt",
                      "prompt_embeds"), fix: str = "") -> None:
        """Refuse a raw request the serving mode cannot serve, instead of ignoring part of it.

        Refused: text (any of ``text_keys``) in a generation request (no ``video`` / ``latents``) on
        a mode without text, an ``"image"`` on a mode that does not generate from one, and a
        text-only generation request (no ``video`` / ``latents`` / ``image``) on an image-to-video
        mode. Training clips may carry their task text (a LeRobot dataset's ``prompt``) whatever the
        backbone reads: there the text is a property of the data, not a request. ``fix`` (the
        backbone's own words: which setting switches the mode) ends the message.
        """
        mode = self.serving
        if mode not in MODE_NAMES or not isinstance(raw, Mapping):
            return
        present = {k for k, v in raw.items() if v is not None}
        text = [k for k in text_keys if k in present]
        what = (f"{backbone} serves {MODE_NAMES[mode]} "
                f"('{mode}'; card capabilities: {listing(self.capabilities)})")
        tail = f" {fix}" if fix else ""
        clips = bool(present & {"video", "latents"})
        if text and mode not in TEXT_MODES and not clips:
            raise CapabilityError(f"{what}, which reads no text, but the request holds {listing(text)}: "
                                  f"it would be ignored. "
                                  f"Remove it, or use a backbone or mode that reads text.{tail}")
        if "image" in present and mode not in IMAGE_MODES:
            raise CapabilityError(f"{what}, which generates without a given first frame, "
                                  f"but the request holds 'image': it would be ignored. "
                                  f"Remove 'image', or use an image-to-video mode."
                                  f"{tail}")
        if mode in IMAGE_MODES and text and not clips and "image" not in present:
            raise CapabilityError(f"{what}, which generates from a given first frame, "
                                  f"but the request is text only (keys {sorted(map(str, raw))}). "
                                  f"Add 'image' (B, 3, H, W) in [-1, 1], or use a text-to-video mode.{tail}")

    def replace(self, **changes) -> ModelCard:
        return dataclasses.replace(self, **changes)
