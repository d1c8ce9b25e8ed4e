"""``easyanimate_latent_residual``: the reference adapter, sized for EasyAnimate's 16-channel latents.

It is workbench's ``latent_residual`` (zero output at init, so ``Add`` / ``GatedResidual`` start
exactly at the frozen base) with EasyAnimate V5.1's latent width as the default. It reads the
per-frame ``action`` the backbone has pooled onto latent frames; EasyAnimate is text-to-video,
so there is no first frame to read.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.adapters.latent_residual import LatentResidual, LatentResidualConfig


@dataclass
class EasyAnimateLatentResidualConfig(LatentResidualConfig):
    """``latent_residual``'s settings with EasyAnimate's 16 latent channels and no first frame."""

    channels: int = 16
    use_first_frame: bool = False


class EasyAnimateLatentResidual(LatentResidual):
    """Zero-initialised latent correction for ``easyanimate``."""

    config_class = EasyAnimateLatentResidualConfig

    def __init__(self, config: EasyAnimateLatentResidualConfig | None = None, **overrides):
        super().__init__(config, **overrides)  # config_class makes the config (or refuses both)
