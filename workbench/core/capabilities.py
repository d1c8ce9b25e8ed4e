"""What a backbone may declare beyond the required part: one small mixin per capability.

:class:`~workbench.core.backbone.BaseVideoModel` holds what every backbone writes. What only some
backbones have is declared on the side, by listing the capability among the class's bases and writing
its members:

```python
class MyBackbone(BaseVideoModel, CachesLatents, InsideAccess):
    def encode_item(self, item): ...
    def inside_spec(self): ...
```

A member whose stub here raises ``NotImplementedError`` must be written by a backbone that declares
the capability; the others have a default, the one every backbone that does not declare the capability
gets too (read through the functions of :mod:`workbench.core.backbone`, e.g.
:func:`~workbench.core.backbone.max_generate_batch`). A class that writes a member of a capability it
does not declare is refused when it is made: workbench would never use it.
``workbench.testing.check_backbone`` finds the capabilities a backbone declares, says which, and checks
each one.

Note that a card's ``capabilities`` (``t2v``, ``i2v``, ...) are something else: the modes the model
serves, data on its :class:`~workbench.core.card.ModelCard`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from workbench.core.card import IMAGE_MODES, ClipSpec
from workbench.core.conditions import Batch
from workbench.core.inside import InsideSpec

DECODER_MODULES = ("vae", "autoencoder", "first_stage_model", "decoder")
"""The attribute names :meth:`Previews.preview_decoder` looks under, in order, for the module
``decode`` runs."""


def _unwritten(backbone: Any, capability: type, member: str, signature: str) -> NotImplementedError:
    return NotImplementedError(
        f"{type(backbone).__name__} declares {capability.__name__} but does not write {member}: "
        f"define {signature} on it (its docstring on workbench.core.capabilities.{capability.__name__} "
        f"says what it promises), or drop {capability.__name__} from its bases."
    )


class GivenFrames:
    """Frames the backbone is given (e.g. an image-to-video model's first frame), kept by every prediction.

    Not declared: predictions are used as they are.
    """

    _must_write = ("constrain",)

    def constrain(self, prediction: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                  cond: Mapping[str, Any]) -> torch.Tensor:
        """``prediction`` with what the backbone fixes by construction enforced.

        E.g. an image-to-video model whose first frame is given makes every prediction map that
        frame onto its conditioning latent. :class:`~workbench.core.composed.ComposedModel` applies it
        to the composed prediction, so what is recorded, recomposed and sampled with is the same
        tensor. It changes only the given frames (``loss_mask`` 0), is idempotent, and leaves
        ``denoise``'s own output unchanged.
        """
        raise _unwritten(self, GivenFrames, "constrain", "constrain(prediction, x_t, t, cond)")


class SamplingOptions:
    """How generation requests reach the backbone's sampler, where that differs from the defaults below.

    Declare it and override the members that differ; the rest keep these defaults, which every
    backbone that does not declare it gets as well.
    """

    max_generate_batch: int | None = None
    """The most clips one ``generate`` call takes (e.g. 1 for a pipeline that conditions every sample
    on one image); ``None``: any number. Callers that predict many clips split them so."""

    sampler_inputs: tuple[str, ...] = ()
    """Keys ``prepare_batch`` puts in ``cond`` for ``run_sampler`` only, not as conditions an adapter
    may consume (so not in ``provides()``), e.g. the first frame's pixels that an image-to-video
    pipeline encodes itself."""

    def generation_inputs(self, video: torch.Tensor) -> dict[str, Any]:
        """What a generation request takes from clips it should reproduce, ``video`` ``(B, 3, T, H, W)``.

        By default, for a card serving an image-to-video mode (``i2v`` / ``ti2v``), the first frames
        ``{"image": (B, 3, H, W)}``; otherwise the clip's size ``{"frames": T, "height": H, "width": W}``.
        A backbone given more frames overrides it (e.g. an interpolation model's ``"last_image"``).
        Evaluations and rollouts build their requests with it.
        """
        card = self.card  # (a BaseVideoModel's, as every member here may read)
        if card is not None and card.serving in IMAGE_MODES:
            return {"image": video[:, :, 0]}
        return {"frames": int(video.shape[2]), "height": int(video.shape[3]), "width": int(video.shape[4])}

    def predictions_per_step(self, batch: Batch, **sampler_kwargs: Any) -> int:
        """How many times one step of ``generate`` calls ``compose_fn`` for ``batch`` with these sampler
        keyword arguments: 1 (the default), plus one per guidance branch (classifier-free guidance makes
        two). A recording keeps each call's prediction for forks, so ``estimate_memory`` and a
        ``StoragePolicy(max_bytes=...)`` budget size the replay cache with it."""
        return 1


class LatentLayout:
    """How latent frames lay out in time, where that is more than one latent frame per frame.

    Declare it and override the members that differ; the rest keep these defaults.
    """

    causal_latents: bool | None = None
    """``True``: a causal video VAE (frame 0 → latent frame 0, then ``r`` frames per latent frame; it is
    decoded whole, never in chunks); ``False``: ``r`` frames per latent frame; ``None`` (the default):
    not declared, read off the decoded length (preferring ``r`` per latent frame when both readings
    fit)."""

    decodes_frames_alone: bool = False
    """``True`` when ``decode`` makes each frame from its own latent frame alone (a per-frame autoencoder,
    one latent frame per frame), the same values whatever other frames it decodes with: a rollout then
    decodes only the frames it reads. ``False`` (the default): decoded whole."""

    def latent_frames(self, frames: int) -> int:
        """How many latent frames ``encode`` makes of ``frames`` pixel frames; ``frames`` by default (one
        latent frame per frame). A video VAE that compresses time overrides it."""
        return int(frames)


class Previews:
    """What a latent preview may call, where the defaults below do not find it.

    Declare it and override the members that differ; the rest keep these defaults.
    """

    pixel_space: bool | None = None
    """``True`` when the samples are the frames themselves (previews are the identity); ``None`` (the
    default): inferred (3-channel latents and no ``vae`` component in the card)."""

    def preview_decoder(self) -> nn.Module | None:
        """The module ``decode`` runs: by default the first attribute named in :data:`DECODER_MODULES`
        that is a module, else ``None`` (the whole backbone is hashed for a preview's cache key)."""
        for name in DECODER_MODULES:
            module = getattr(self, name, None)  # names a backbone may or may not have
            if isinstance(module, nn.Module):
                return module
        return None

    def preview_identity(self) -> str | None:
        """A name for what ``decode`` computes (e.g. the VAE checkpoint's hash), used as the latent-preview
        cache key instead of hashing the weights of :meth:`preview_decoder`. ``None`` (the default):
        hash them."""
        return None


class CachesLatents:
    """The frozen base's work on one dataset item, done ahead (``training.cache_latents``,
    ``workbench cache-latents``). Not declared: latent caches are refused."""

    _must_write = ("encode_item",)

    def encode_item(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """One raw dataset item with the frozen base's work done ahead, or ``None`` for an item with
        nothing to do ahead (e.g. no ``"video"``).

        Returns the item with its heavy, frozen part replaced by what ``prepare_batch`` accepts instead
        after collation (e.g. ``"video"`` → ``"latents"``, on the CPU): ``prepare_batch`` of collated
        cached items must equal ``prepare_batch`` of the collated raw items, bit for bit.
        """
        raise _unwritten(self, CachesLatents, "encode_item", "encode_item(item)")


class InsideAccess:
    """Where an adapter inside the base (``lora``, ``action_modulation``, ``controlnet``) reaches.

    Not declared: such adapters are refused, saying to declare it; ``compile()`` compiles the root of
    this spec unless :class:`Compilable` names another network.
    """

    _must_write = ("inside_spec",)

    def inside_spec(self) -> InsideSpec:
        """An :class:`~workbench.core.inside.InsideSpec`: the network every prediction runs through, the
        layers LoRA targets by default, the blocks hooks sit on and their layout."""
        raise _unwritten(self, InsideAccess, "inside_spec", "inside_spec() returning a workbench.InsideSpec")


class Compilable:
    """The network ``compile()`` runs through ``torch.compile``, for a backbone that has no
    :class:`InsideAccess` (whose root it compiles otherwise)."""

    _must_write = ("compile_target",)

    def compile_target(self) -> nn.Module:
        """The network every prediction runs through (a submodule of the backbone)."""
        raise _unwritten(self, Compilable, "compile_target", "compile_target() returning that network")


class MemoryPlanning:
    """What ``workbench plan`` traces and counts to size a training step without running one.

    ``planning_inputs`` must be written; the other members have defaults.
    """

    _must_write = ("planning_inputs",)

    def planning_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """What ``denoise`` is called with in a training step on ``latents`` (the clip's native size,
        usually on the meta device): ``(t, cond)``, zeros of the right shapes and dtypes."""
        raise _unwritten(self, MemoryPlanning, "planning_inputs", "planning_inputs(latents) -> (t, cond)")

    def latent_shape(self, clip: ClipSpec) -> tuple[int, ...]:
        """``(C, T', h, w)``: the latents ``encode`` makes of one clip of that size. The default encodes a
        zero clip on the meta device; a backbone whose encoder cannot run there overrides it."""
        video = torch.zeros(1, 3, clip.frames, clip.height, clip.width, device="meta")
        return tuple(self.encode(video).shape[1:])

    def frozen_encoders(self) -> tuple[nn.Module, ...]:
        """Frozen encoders held outside the backbone's submodules (loaded when first needed, e.g.
        conditioning towers): a memory plan counts their weights. None by default."""
        return ()

    def planning_notes(self) -> tuple[str, ...]:
        """What a memory plan of this backbone does not count, in words (e.g. a text encoder the
        configuration leaves out). None by default."""
        return ()


class KeepsFloat32:
    """Layers that stay float32 whatever dtype the backbone is moved to. Not declared: none."""

    _must_write = ("keep_in_float32",)

    def keep_in_float32(self) -> tuple[str, ...]:
        """Dotted paths of the submodules (or single parameters) that stay float32.

        Layers that compute in float32 (a norm upcasting its input, a VAE upstream runs in float32)
        keep their weights in float32, as diffusers' ``_keep_in_fp32_modules`` does at load time:
        ``base.to(torch.bfloat16)`` moves them to the new device, not to the new dtype, so a backbone
        moved to bf16 is the one a bf16 load makes; ``base.dtype`` is the dtype of the first parameter
        outside them.
        """
        raise _unwritten(self, KeepsFloat32, "keep_in_float32", "keep_in_float32() -> tuple of paths")


class TrainingCallbacks:
    """Callbacks the backbone brings to every training run it is part of. Not declared: none."""

    _must_write = ("callbacks",)

    def callbacks(self) -> tuple:
        """The :class:`~workbench.core.callbacks.Callback` instances to add to a run."""
        raise _unwritten(self, TrainingCallbacks, "callbacks", "callbacks() -> tuple of Callbacks")


CAPABILITIES: tuple[type, ...] = (GivenFrames, SamplingOptions, LatentLayout, Previews, CachesLatents,
                                  InsideAccess, Compilable, MemoryPlanning, KeepsFloat32, TrainingCallbacks)
"""Every capability a backbone may declare, in the order reports list them."""


def members(capability: type) -> tuple[str, ...]:
    """The public names ``capability`` declares (methods and attributes), in the order written."""
    return tuple(name for name in vars(capability) if not name.startswith("_"))


def must_write(capability: type) -> tuple[str, ...]:
    """The members of ``capability`` without a default: a backbone declaring it writes them."""
    return vars(capability).get("_must_write", ())


def declared(backbone: Any) -> tuple[type, ...]:
    """The capabilities ``backbone`` (a class or an instance) declares, in :data:`CAPABILITIES` order."""
    cls = backbone if isinstance(backbone, type) else type(backbone)
    return tuple(c for c in CAPABILITIES if issubclass(cls, c))


def unwritten(backbone: Any) -> dict[str, tuple[str, ...]]:
    """Capability name → the members ``backbone`` declares but leaves as the capability's stub;
    ``{}`` when it writes them all."""
    cls = backbone if isinstance(backbone, type) else type(backbone)
    found = {c.__name__: tuple(m for m in must_write(c) if getattr(cls, m) is vars(c)[m])
             for c in declared(cls)}
    return {name: left for name, left in found.items() if left}


def undeclared(backbone: Any) -> dict[str, tuple[str, ...]]:
    """Capability name → the members of it that ``backbone`` (a class, or an instance: its attributes
    too) writes without declaring it; ``{}`` when there are none."""
    cls = backbone if isinstance(backbone, type) else type(backbone)
    own = set(vars(backbone)) if not isinstance(backbone, type) else set()
    for klass in cls.__mro__:
        if klass not in CAPABILITIES:
            own |= set(vars(klass))
    found = {c.__name__: tuple(m for m in members(c) if m in own)
             for c in CAPABILITIES if not issubclass(cls, c)}
    return {name: written for name, written in found.items() if written}


__all__ = ["CAPABILITIES", "CachesLatents", "Compilable", "DECODER_MODULES", "GivenFrames", "InsideAccess",
           "KeepsFloat32", "LatentLayout", "MemoryPlanning", "Previews", "SamplingOptions",
           "TrainingCallbacks", "declared", "members", "must_write", "undeclared", "unwritten"]
