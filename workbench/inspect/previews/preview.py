"""Latent previews: fitting the picture of latents that every view shows.

Three ways turn latents into pictures (:data:`DECODES`): the **linear preview**
(:mod:`~workbench.inspect.previews.linear_preview`: a least-squares latent → RGB map, free and about
20 dB from the full decode), the **tiny preview** (:mod:`~workbench.inspect.previews.tiny_preview`: a
small convolutional decoder distilled from the backbone's own, the faithful preview) and the
backbone's **full** decoder (:func:`~workbench.inspect.previews.latent_space.decode_chunked`).
:func:`fit_preview` fits (or loads) either preview; both are cached per backbone identity
(:mod:`~workbench.inspect.previews.preview_cache`), and :func:`clear_preview_cache` forgets them.
"""

from __future__ import annotations

from typing import Any

from workbench.core.backbone import BaseVideoModel
from workbench.inspect.common import InspectError
from workbench.inspect.previews.latent_space import DEFAULT_CHUNK_FRAMES
from workbench.inspect.previews.linear_preview import LatentPreview, clear_linear_cache, fit_linear_preview
from workbench.inspect.previews.preview_cache import cache_dir, clear_identities
from workbench.inspect.previews.tiny_preview import TinyPreview, clear_tiny_cache, fit_tiny_preview

DECODES = ("preview", "tiny", "full")
"""How latents become pictures: the linear preview, the distilled tiny preview
(:mod:`workbench.inspect.previews.tiny_preview`), or the backbone's full decoder."""
PREVIEW_KINDS = ("linear", "tiny")


def clear_preview_cache(disk: bool = False) -> None:
    """Forget the previews held in memory (and, with ``disk=True``, delete the cached files).

    Args:
        disk: Also delete the previews cached on disk, so the next use fits them again.
    """
    clear_linear_cache()
    clear_tiny_cache()
    clear_identities()
    if disk and cache_dir().exists():
        for path in cache_dir().glob("*"):
            if path.suffix in (".safetensors", ".json"):  # linear and tiny previews
                path.unlink()


def fit_preview(base: BaseVideoModel, samples: Any = None, *, kind: str = "linear",
                latent_shape: tuple[int, ...] | None = None, n_fit: int | None = None, n_heldout: int = 4,
                seed: int = 0, cache: bool = True, refit: bool = False,
                chunk_frames: int | None = DEFAULT_CHUNK_FRAMES,
                **distil: Any) -> LatentPreview | TinyPreview:
    """Fit (or load) the linear preview of ``base``, or with ``kind="tiny"`` distil (or load) its tiny
    preview.

    A fit on samples is kept in memory for this process's views only.

    Args:
        base: The backbone whose decoder the preview imitates.
        samples: Real frames to encode: video ``(N, 3, T, H, W)`` in [-1, 1], uint8 ``(N, T, H, W, 3)`` or
            a raw batch; the last ``n_heldout`` clips (at least one) measure the fit, the rest fit it.
            None: data-free latent clips are used.
        kind: ``"linear"``, or ``"tiny"`` for a small convolutional decoder distilled from
            ``base.decode`` (:class:`~workbench.inspect.previews.tiny_preview.TinyPreview`).
        latent_shape: ``(C, T', h, w)`` of the data-free clips (default: the card's resolution, at most 4
            latent frames).
        n_fit: How many data-free clips fit it (default: the kind's own; 24 for ``"tiny"``).
        n_heldout: How many clips measure it.
        seed: The seed of the data-free clips and of the distillation.
        cache: Load a preview already on disk for this backbone instead of fitting when no samples are
            given, and save a data-free fit.
        refit: Fit even when a cached preview exists.
        chunk_frames: How many latent frames ``base.decode`` decodes at a time while fitting (None: all).
        **distil: With ``kind="tiny"``, its training settings (``steps``, ``width``, ``batch``, ``lr``).

    Returns:
        The preview, a callable from latents ``(B, C, T', h, w)`` to video ``(B, 3, T, H, W)`` in [-1, 1];
        its ``psnr`` is the held-out PSNR against ``base.decode``.

    Examples:
        >>> preview = fit_preview(model.base)
        >>> preview(traj.final).shape           # (B, 3, T, H, W) in [-1, 1]
        torch.Size([2, 3, 16, 64, 64])
        >>> round(preview.psnr, 1), round(preview.baseline_psnr, 1)   # held-out dB against base.decode
        (18.6, 15.6)
        >>> tiny = fit_preview(model.base, kind="tiny")    # the one shipped with the pretrained weights
        >>> round(tiny.psnr, 1), round(tiny.linear_psnr, 1)            # held-out dB, distilled vs linear
        (26.4, 18.3)
    """
    if kind not in PREVIEW_KINDS:
        raise InspectError(f"fit_preview(kind={kind!r}): unknown preview kind. "
                           f"Allowed: {', '.join(PREVIEW_KINDS)} ('linear': least-squares per latent pixel; "
                           f"'tiny': a distilled convolutional decoder).")
    if kind == "tiny":
        return fit_tiny_preview(base, samples, latent_shape=latent_shape,
                                n_fit=24 if n_fit is None else n_fit, n_heldout=n_heldout, seed=seed,
                                cache=cache, refit=refit, chunk_frames=chunk_frames, **distil)
    if distil:
        raise InspectError(f"fit_preview(kind='linear') takes no distillation settings; "
                           f"got {sorted(distil)}. They apply to kind='tiny'.")
    return fit_linear_preview(base, samples, latent_shape=latent_shape, n_fit=8 if n_fit is None else n_fit,
                              n_heldout=n_heldout, seed=seed, cache=cache, refit=refit,
                              chunk_frames=chunk_frames)
