"""``dynamicrafter_latent_residual``: the reference adapter, sized for DynamiCrafter's 4-channel latents.

workbench's ``latent_residual`` (zero output at init, so ``Add`` / ``GatedResidual`` start exactly
at the frozen base). It reads the per-frame ``action`` and the first frame's latent
(``first_frame``), both supplied by the ``dynamicrafter`` backbone.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.adapters.latent_residual import LatentResidual, LatentResidualConfig


@dataclass
class DynamiCrafterLatentResidualConfig(LatentResidualConfig):
    """``latent_residual``'s settings with ``channels`` fixed by default to DynamiCrafter's 4."""

    channels: int = 4


class DynamiCrafterLatentResidual(LatentResidual):
    """Zero-initialised latent correction for ``dynamicrafter``."""

    config_class = DynamiCrafterLatentResidualConfig

    def __init__(self, config: DynamiCrafterLatentResidualConfig | None = None, **overrides):
        super().__init__(config, **overrides)  # config_class makes the config (or refuses both)
