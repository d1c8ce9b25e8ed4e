"""``wan22_latent_residual``: the reference adapter, sized for Wan2.2's 48-channel latents.

It is workbench's ``latent_residual`` (zero output at init, so ``Add`` / ``GatedResidual`` start
exactly at the frozen base) with Wan2.2's latent width as the default. It reads the per-frame
``action`` the backbone has pooled onto latent frames, and the first frame's latent.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.adapters.latent_residual import LatentResidual, LatentResidualConfig


@dataclass
class Wan22LatentResidualConfig(LatentResidualConfig):
    """``latent_residual``'s settings with ``channels`` defaulting to Wan2.2's 48."""

    channels: int = 48


class Wan22LatentResidual(LatentResidual):
    """Zero-initialised latent correction for ``wan22_ti2v``."""

    config_class = Wan22LatentResidualConfig

    def __init__(self, config: Wan22LatentResidualConfig | None = None, **overrides):
        super().__init__(config, **overrides)  # config_class makes the config (or refuses both)
