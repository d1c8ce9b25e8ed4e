"""Control videos derived from a clip: what a ControlNet-style adapter reads besides the noisy latent.

A control video is a per-pixel condition ``(C, T, H, W)`` in [-1, 1] given alongside the clip
(the raw batch's ``"control"``; see :func:`workbench.core.backbone.control_video`). Datasets
that can derive one from their frames take ``control: edges`` in their config; your own data
can carry any control video (depth, segmentation, ...) under that key.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.config import check
from workbench.errors import DataError

#: Luma weights of RGB (BT.601), for an edge map of a colour frame.
LUMA = (0.299, 0.587, 0.114)


def edges(video: torch.Tensor) -> torch.Tensor:
    """The edge map of a clip: ``(3, T, H, W)`` in [-1, 1] → ``(1, T, H, W)`` in [-1, 1].

    Per frame, the Sobel gradient magnitude of the luma, divided by that of a black-to-white step
    edge and clipped at 1, then mapped to [-1, 1]: a flat region is exactly -1, a full step edge
    1. Replicate padding: the frame's border is not an edge.

    Args:
        video: One clip, float ``(3, T, H, W)`` in [-1, 1].

    Returns:
        Its edge map, ``(1, T, H, W)`` in [-1, 1], in the clip's dtype and device.

    Raises:
        DataError: When ``video`` is not a float ``(3, T, H, W)`` clip.
    """
    if video.ndim != 4 or video.shape[0] != 3 or not video.is_floating_point():
        raise DataError(f"edges expects a float clip (3, T, H, W) in [-1, 1], "
                        f"got {tuple(video.shape)} {video.dtype}.")
    weights = torch.tensor(LUMA, dtype=video.dtype, device=video.device).view(3, 1, 1, 1)
    luma = (video * weights).sum(dim=0)[:, None]  # (T, 1, H, W)
    sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=video.dtype,
                         device=video.device)
    kernels = torch.stack([sobel, sobel.T])[:, None]  # (2, 1, 3, 3): d/dx, d/dy
    gradient = F.conv2d(F.pad(luma, (1, 1, 1, 1), mode="replicate"), kernels)  # (T, 2, H, W)
    magnitude = gradient.pow(2).sum(dim=1).sqrt() / 8.0  # a step from -1 to 1 gives 8
    return (magnitude.clamp(0.0, 1.0) * 2.0 - 1.0)[None]  # (1, T, H, W)


#: The control videos a dataset can derive from its frames (its config's ``control``).
CONTROLS = {"edges": edges}


def check_control(name: str | None) -> None:
    """Inside a dataset config's ``__post_init__``: ``control`` is ``None`` or a name in :data:`CONTROLS`."""
    check(name is None or name in CONTROLS, "control",
          f"must be null (no control video) or one of {sorted(CONTROLS)}, got {name!r}.")


def with_control(item: dict, name: str | None) -> dict:
    """``item`` with the control video ``name`` derived from its ``"video"`` (``(C, T, H, W)``); as is for
    ``None``."""
    if name is not None:
        item["control"] = CONTROLS[name](item["video"])
    return item


__all__ = ["CONTROLS", "check_control", "edges", "with_control"]
