"""``controlnet``: a trainable copy of the base's first blocks feeding zero-initialised residuals back.

At attach time the first ``blocks`` blocks of the base are copied (with the base's weights) into
the adapter. In each adapted forward a pre-hook on the base's first block takes that block's
inputs, adds an embedding of the declared condition to the hidden state, and runs the copy;
each copied block's output goes through a zero-initialised linear projection, and a forward
hook on the matching base block adds it to that block's output. At init every projection is
exactly zero, so the adapted base is the base bit for bit; gradients reach only the copy, the
embedding and the projections.

The condition is either a per-frame vector (``action`` by default: a linear embedding per
frame) or, with ``video: true``, a control video ``(B, C, T, H, W)`` such as edges or depth
(the raw batch's ``"control"``): a small convolutional encoder run on each frame, pooled onto
the first block's grid (frames, height, width, whatever the backbone's latent and patch sizes)
and projected to its width, so each position of the hidden state gets the control of the
pixels it covers.

Under gradient checkpointing (``transformer.enable_gradient_checkpointing()``) the base's first
block is run unchecked while the adapter is engaged: the branch runs inside its pre-hook and
must not be recomputed by a backward. The other blocks stay checkpointed.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.adapters.inside import InsideSpec, InsideSpecAdapter, per_frame
from workbench.adapters.path import PATH_CHANNELS, PATH_SIGNAL, ActionPath, PathConfig
from workbench.config import check, config_from
from workbench.core.conditions import Condition
from workbench.errors import CompositionError, ConfigError
from workbench.layers import with_running_sum
from workbench.registry import register


@dataclass
class ControlNetConfig:
    """``blocks``: how many leading blocks of the base to copy (N >= 1). ``condition`` /
    ``aliases`` / ``dim`` / ``dropout``: the condition the branch reads — a per-frame vector of
    width ``dim`` (``action`` by default), or with ``video: true`` a control video of ``dim``
    channels (e.g. ``condition: control, video: true, dim: 1`` for an edge map), embedded by a
    convolutional encoder of ``encoder_width`` channels that halves the frames' size
    ``encoder_downsample`` times before pooling onto the block's grid. ``cumulative`` (vectors
    only): also embed the running sum of the condition over the previous frames. ``path`` (vectors
    only): also draw the hand's path implied by the first frame's measured position and the actions
    (:class:`~workbench.adapters.path.PathConfig` options, ``{}`` for the defaults) on the latent grid;
    its maps go through a convolutional encoder onto the first block's grid, and its image position
    joins the per-frame embedding. Computed from the ``action`` condition in the forward, so an
    edit of the actions moves it; needs the ``ee_pos`` and ``camera`` conditions."""

    blocks: int = 1
    condition: str = "action"
    aliases: tuple[str, ...] = ("actions",)
    dim: int = 4
    dropout: float = 0.0
    video: bool = False
    encoder_width: int = 16
    encoder_downsample: int = 2
    cumulative: bool = False
    path: dict | None = None

    def __post_init__(self):
        check(self.blocks >= 1, "blocks",
              f"must be >= 1 (how many leading blocks to copy), got {self.blocks}.")
        check(self.condition.isidentifier(), "condition", f"must be an identifier, got {self.condition!r}.")
        check(self.dim >= 1, "dim",
              f"must be >= 1 (the condition's width, or a video's channels), got {self.dim}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")
        check(not (self.cumulative and self.video), "cumulative",
              "sums a per-frame vector over frames; a control video (video: true) has none. "
              "Drop one of the two.")
        if self.path is not None:
            check(not self.video, "path", "draws the path of per-frame actions; a control video "
                                          "(video: true) has none. Drop one of the two.")
            self.path = PathConfig.checked(self.path, self.dim)
        check(self.encoder_width >= 1, "encoder_width", f"must be >= 1, got {self.encoder_width}.")
        check(0 <= self.encoder_downsample <= 6, "encoder_downsample",
              f"must be in 0..6 (how many times the control video's frames are halved), got "
              f"{self.encoder_downsample}.")


class ControlVideoEncoder(nn.Module):
    """A control video ``(B, C, T, H, W)`` → features on a block's grid ``(B, T', h, w, width)``.

    Each frame goes through a 3x3 convolution and ``downsample`` stride-2 convolutions (SiLU
    between), then the features are average-pooled onto ``(T', h, w)`` and projected to ``width``.
    """

    def __init__(self, channels: int, width: int, hidden: int = 16, downsample: int = 2):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(channels, hidden, 3, padding=1), nn.SiLU()]
        for _ in range(downsample):
            layers += [nn.Conv2d(hidden, hidden, 3, stride=2, padding=1), nn.SiLU()]
        self.frames = nn.Sequential(*layers)
        self.out = nn.Linear(hidden, width)

    def forward(self, video: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        b, _, t = video.shape[:3]
        features = self.frames(video.transpose(1, 2).flatten(0, 1))  # (B * T, hidden, H', W')
        features = features.unflatten(0, (b, t)).transpose(1, 2)  # (B, hidden, T, H', W')
        features = F.adaptive_avg_pool3d(features, grid)
        return self.out(features.movedim(1, -1))  # (B, T', h, w, width)


def block_grid(hidden: torch.Tensor, layout: str, latent_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(T', h, w)`` of a block's hidden state, given the latents' ``(B, C, T', H, W)`` it was computed
    from."""
    frames, height, width = latent_shape[2:]
    if layout == "channels":
        return tuple(hidden.shape[2:5])
    if layout == "frames":
        return (frames, *hidden.shape[-2:])
    per_frame = hidden.shape[1] // frames  # tokens: T' * h * w, with h / w = H / W
    patch = math.isqrt(height * width // per_frame) if per_frame else 0
    if not patch or hidden.shape[1] != frames * (height // patch) * (width // patch):
        raise CompositionError(
            f"controlnet: a block's {hidden.shape[1]} tokens are not a {frames}-frame grid of the "
            f"{height}x{width} latents patched by a square patch size; a control video needs the tokens "
            f"laid out frame-major on a patch grid."
        )
    return frames, height // patch, width // patch


def to_layout(features: torch.Tensor, layout: str) -> torch.Tensor:
    """Features ``(B, T', h, w, W)`` in a block's hidden layout (see :class:`InsideSpec`)."""
    if layout == "channels":
        return features.movedim(-1, 1)  # (B, W, T', h, w)
    if layout == "frames":
        return features.flatten(0, 1).movedim(-1, 1)  # (B * T', W, h, w)
    return features.flatten(1, 3)  # (B, T' * h * w, W)


@register("adapter", "controlnet")
class ControlNet(InsideSpecAdapter):
    """A trainable copy of the first N blocks whose outputs return through zero-initialised projections."""

    config_class = ControlNetConfig

    def __init__(self, config: ControlNetConfig | None = None, **overrides):
        super().__init__()
        self.config = config = config_from(type(self), config, overrides)
        self.path = ActionPath(PathConfig(**config.path), "controlnet") if config.path is not None else None
        self.consumes = (Condition(config.condition, aliases=config.aliases, dim=config.dim,
                                   per_frame=None if config.video else "keep", dropout=config.dropout,
                                   video=config.video),
                         *(self.path.conditions() if self.path else ()))

    @classmethod
    def from_config(cls, config: ControlNetConfig) -> ControlNet:
        return cls(config)

    def attach_base_model(self, base) -> None:
        if self.path is not None:
            self.path.check_base(base)  # before the base is reached into: a refusal leaves it untouched
        super().attach_base_model(base)

    def attach(self, spec: InsideSpec) -> None:
        n = self.config.blocks
        if n > spec.branch_blocks:
            raise ConfigError(
                f"controlnet blocks: {n} is more than {type(self.bound_backbone).__name__} has to copy: "
                f"its first "
                f"{spec.branch_blocks} blocks form the chain a copy can run ({spec.root_name}). Use blocks: "
                f"{spec.branch_blocks} or fewer."
            )
        copies = []
        for block in spec.blocks[:n]:
            twin = copy.deepcopy(block)  # before any hook is registered on the base: the copy has none
            for m in twin.modules():
                m.__dict__.pop("train", None)  # the base's modules are pinned to eval; the copy trains
            twin.requires_grad_(True)
            copies.append(twin)
        self.copies = nn.ModuleList(copies)
        width = spec.widths[0]
        c = self.config
        self.embed = (ControlVideoEncoder(c.dim, width, c.encoder_width, c.encoder_downsample) if c.video
                      else nn.Linear(c.dim * (1 + int(c.cumulative)), width))
        if self.path is not None:
            self.path_maps = ControlVideoEncoder(PATH_CHANNELS, width, c.encoder_width, downsample=0)
            self.path_signal = nn.Linear(PATH_SIGNAL, width)
        self.projections = nn.ModuleList(nn.Linear(w, w) for w in spec.widths[:n])
        for proj in self.projections:
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)
        spec.blocks[0].register_forward_pre_hook(self._run_branch, with_kwargs=True)
        for i in range(n):
            spec.blocks[i].register_forward_hook(self._add_residual(i))

    def prepare_state(self, cond, x_t, t):
        signal = getattr(cond, self.config.condition).to(x_t.dtype)  # (B, T, D), or a video (B, C, T, H, W)
        if self.config.video:  # embedded on the first block's grid when it runs
            return {"video": signal, "latent_shape": tuple(x_t.shape), "residuals": None}
        maps = None
        # drawn from the actions as given (an edit moves it) and the first frame's state
        if self.path is not None:
            maps, along = self.path.render(cond, signal, x_t.shape[-2], x_t.shape[-1])
        if self.config.cumulative:
            signal = with_running_sum(signal)  # (B, T, 2D)
        embedding = self.embed(signal)  # (B, T, W)
        if maps is not None:
            embedding = embedding + self.path_signal(along.to(embedding.dtype))
        return {"embedding": embedding, "residuals": None, "path": maps, "latent_shape": tuple(x_t.shape)}

    def _embedding(self, hidden: torch.Tensor) -> torch.Tensor:
        """The condition's embedding, broadcastable onto the first block's ``hidden`` state."""
        layout, state = self.spec.layout, self.state
        if not self.config.video:
            embedding = per_frame(state["embedding"], hidden, layout)
            if state.get("path") is None:
                return embedding
            grid = block_grid(hidden, layout, state["latent_shape"])
            return embedding + to_layout(self.path_maps(state["path"], grid), layout).to(hidden.dtype)
        grid = block_grid(hidden, layout, state["latent_shape"])
        return to_layout(self.embed(state["video"], grid), layout).to(hidden.dtype)

    def _run_branch(self, module, args, kwargs):
        if not self.active:
            return None
        layout = self.spec.layout
        hidden = args[0]
        state = self.state
        h = hidden + self._embedding(hidden)
        rest = args[1:]
        residuals = []
        for twin, proj in zip(self.copies, self.projections):
            h = twin(h, *rest, **kwargs)
            # (hidden, *carried): the carried outputs are the next block's next inputs
            if isinstance(h, tuple):
                h, carried = h[0], h[1:]
                rest = (*carried, *rest[len(carried):])
            z = (h if layout == "tokens" else h.movedim(1, -1)).to(proj.weight.dtype)  # a bf16 copy's output
            out = proj(z) if layout == "tokens" else proj(z).movedim(-1, 1)
            residuals.append(out)
        state["residuals"] = residuals
        return None

    def _add_residual(self, index: int):
        def hook(module, args, output):
            if not self.active or self.state["residuals"] is None:
                return None
            residual = self.state["residuals"][index]
            if isinstance(output, tuple):
                return (output[0] + residual.to(output[0].dtype), *output[1:])
            return output + residual.to(output.dtype)

        return hook

    @contextmanager
    def engaged(self, cond, x_t, t):
        root = self.spec.root
        native = root.__dict__.get("_gradient_checkpointing_func")
        if native is None:
            with super().engaged(cond, x_t, t):
                yield self
            return
        first = self.spec.blocks[0]

        def checkpointed(block, *args, **kwargs):
            return block(*args, **kwargs) if block is first else native(block, *args, **kwargs)

        root._gradient_checkpointing_func = checkpointed
        try:
            with super().engaged(cond, x_t, t):
                yield self
        finally:
            root._gradient_checkpointing_func = native


__all__ = ["ControlNet", "ControlNetConfig", "ControlVideoEncoder"]
