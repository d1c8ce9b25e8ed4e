"""``lora``: peft's LoRA on the frozen base's own layers.

The low-rank updates are peft's (``peft.inject_adapter_in_model``), injected into the network
every prediction runs through (tiny_video's denoiser, Wan's transformer). ``lora_B`` starts at
zero, so the adapted base is the base bit for bit at init; the base's own weights stay frozen
and only ``lora_A`` / ``lora_B`` train, sit in the optimizer and go into checkpoints.

    adapter:
      type: lora
      config: {rank: 8, alpha: 8, targets: [to_q, to_k, to_v, to_out.0]}

``exp.export_lora(path)`` writes the weights in the format diffusers' pipelines load with
``load_lora_weights``; ``init_from`` starts a fit from a LoRA trained elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.adapters.inside import InsideSpec, InsideSpecAdapter, LoraModules, LoraSettings
from workbench.config import config_from
from workbench.registry import register


@dataclass
class LoRAConfig(LoraSettings):
    """peft LoRA settings (see :class:`~workbench.adapters.inside.LoraSettings`): ``rank``,
    ``alpha``, ``dropout``, ``targets`` (``None`` = the backbone's defaults), ``init_from``."""


@register("adapter", "lora")
class LoRA(InsideSpecAdapter):
    """peft's LoRA on the base's layers; reads no condition (a plain fine-tune of the frozen base).

    Examples:
        >>> from workbench import AdapterExperiment
        >>> from workbench.backbones.tiny_video import TinyVideo
        >>> tiny = AdapterExperiment(base=TinyVideo(image_size=16, frames=4, width=16, ae_width=8, depth=1),
        ...                          adapter=LoRA(rank=4))        # composer: replace
        >>> type(tiny.model.composer).__name__
        'Replace'
    """

    config_class = LoRAConfig
    requires_extras = {"peft": ("peft",)}

    def __init__(self, config: LoRAConfig | None = None, **overrides):
        super().__init__()
        self.config = config_from(type(self), config, overrides)
        self.consumes = ()

    @classmethod
    def from_config(cls, config: LoRAConfig) -> LoRA:
        return cls(config)

    def attach(self, spec: InsideSpec) -> None:
        self.lora = LoraModules(self.config, spec, type(self.bound_backbone).__name__)
        object.__setattr__(self, "_lora_layers", self.lora.found)

    def prepare_state(self, cond, x_t, t):
        return True  # LoRA layers read nothing per call
