"""ModelCard: what a backbone is, where its weights come from, and how it must be sampled.

A card is validated when it is built, so a wrong card fails before any compute. The recipe
may assume a sampler: a model distilled for 4 steps refuses a 50-step request with a
:class:`~workbench.errors.SamplerMismatchError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from workbench.errors import CardError, SamplerMismatchError, did_you_mean, listing

PREDICTION_TYPES = ("eps", "v", "x0", "velocity")
CAPABILITIES = ("t2v", "i2v", "ti2v", "v2v", "t2i", "action")
DTYPES = ("float32", "bfloat16", "float16")
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

    >>> card = ModelCard(model_id="tiny", family="tiny_video", prediction_type="velocity",
    ...                  components={"denoiser": ComponentSpec("denoiser")},
    ...                  capabilities=("i2v",))
    """

    model_id: str
    family: str
    prediction_type: str
    components: dict[str, ComponentSpec] = field(default_factory=dict)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    precision: dict[str, str] = field(default_factory=lambda: {"cpu": "float32", "cuda": "float32"})
    capabilities: tuple[str, ...] = ()
    recipe: RecipeSpec = field(default_factory=RecipeSpec)
    samplers: tuple[str, ...] = ("euler",)
    notes: str = ""

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
        for device, dtype in self.precision.items():
            if dtype not in DTYPES:
                errs.append(f"precision[{device!r}]={dtype!r}; allowed: {listing(DTYPES)}.")
        s = self.sampling
        if not isinstance(s.steps, int) or s.steps < 1:
            errs.append(f"sampling.steps={s.steps!r}; must be a positive int.")
        if not self.samplers:
            errs.append("samplers is empty; name the native sampler(s) generate() runs.")
        elif s.sampler not in self.samplers:
            errs.append(f"sampling.sampler={s.sampler!r} is not one of the card's samplers {listing(self.samplers)}.")
        for name in ("height", "width", "num_frames", "fps"):
            value = getattr(s, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                errs.append(f"sampling.{name}={value!r}; must be a positive int or None.")
        if s.shift is not None and s.shift <= 0:
            errs.append(f"sampling.shift={s.shift!r}; must be > 0 or None.")
        if s.guidance_scale is not None and s.guidance_scale < 0:
            errs.append(f"sampling.guidance_scale={s.guidance_scale!r}; must be >= 0 or None.")
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
        return self.precision.get(device_type, "float32")

    def replace(self, **changes) -> ModelCard:
        return dataclasses.replace(self, **changes)
