"""What the adapters that reach into the frozen base share: where to reach, hooks, peft's LoRA.

An *inside* adapter changes the base's own forward instead of correcting its output, so the
composed prediction is the base's prediction with the adapter engaged
(``reuses_base_output = False``). :class:`InsideSpecAdapter` gives every such adapter the same
two switches, which :class:`~workbench.ComposedModel` drives:

* ``engaged(cond, x_t)`` — for the length of the block, the base's forward is the adapted one
  (hooks read ``cond``; LoRA layers are on);
* ``switched_off()`` — for the length of the block, the base is exactly the frozen base (hooks
  return their input untouched, peft's LoRA layers call only their base layer).

Where to reach is the backbone's to say, through the contract: its ``inside_spec()`` returns an
:class:`~workbench.core.inside.InsideSpec` (which module to reach into, which layers LoRA targets
by default, which blocks the hooks sit on); :func:`reach_in` asks for it. Nothing here knows a
backbone by name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from workbench.core.adapter import InsideAdapter
from workbench.core.capabilities import InsideAccess
from workbench.core.conditions import Conditioning
from workbench.core.inside import InsideSpec
from workbench.errors import CompositionError, ConfigError, listing


def reach_in(base) -> InsideSpec:
    """The :class:`InsideSpec` of ``base`` (its own ``inside_spec()``), or a CompositionError saying how to
    get one."""
    if not isinstance(base, InsideAccess):
        raise CompositionError(
            f"{type(base).__name__} does not say where adapters may reach into it: "
            f"it does not declare InsideAccess. Inside adapters (lora, action_modulation, controlnet) "
            f"reach where a backbone's inside_spec() says; "
            f"declare InsideAccess on it (from workbench.core.capabilities) with `inside_spec()` returning "
            f"a workbench.InsideSpec (the network, its blocks, their widths and layout), "
            f"or use latent_residual, which sits beside the base."
        )
    spec = base.inside_spec()
    if not isinstance(spec, InsideSpec):
        raise CompositionError(f"{type(base).__name__}.inside_spec() returned {type(spec).__name__}, not a "
                               f"workbench.InsideSpec.")
    return spec


def per_frame(values: torch.Tensor, hidden: torch.Tensor, layout: str) -> torch.Tensor:
    """Per-frame ``values`` ``(B, T, W)`` broadcastable onto a block's ``hidden`` state.

    ``channels``: ``(B, W, T, 1, 1)``; ``frames``: ``(B * T, W, 1, 1)``; ``tokens``:
    ``(B, T * h * w, W)`` (each frame's value repeated over its tokens, frame-major as the patch
    embedding flattens them).
    """
    values = values.to(hidden.dtype)
    if layout == "channels":
        return values.permute(0, 2, 1)[..., None, None]
    if layout == "frames":
        return values.flatten(0, 1)[..., None, None]  # (B * T, W, 1, 1)
    b, frames, width = values.shape
    tokens = hidden.shape[1]
    if tokens % frames:
        raise CompositionError(f"A block's hidden state has {tokens} tokens, "
                               f"not a multiple of the condition's {frames} frames; "
                               f"the condition must be per latent frame (e.g. Wan's pooled 'action').")
    return values[:, :, None].expand(b, frames, tokens // frames, width).reshape(b, tokens, width)


def check_indices(indices: Sequence[int] | None, count: int, field: str, what: str) -> tuple[int, ...]:
    """``indices`` (``None``: all ``count``) checked against ``count``, or a ConfigError with the fix."""
    if indices is None:
        return tuple(range(count))
    bad = [i for i in indices if not 0 <= i < count]
    if bad or len(set(indices)) != len(indices):
        raise ConfigError(f"{field}: {list(indices)} is not a list of distinct block indices; "
                          f"{what} has {count} blocks (0..{count - 1}). "
                          f"Pick from those, or leave {field} unset for all of them.")
    return tuple(sorted(indices))


OWNER = "_workbench_inside_adapter"  # set on the backbone an inside adapter is attached to


class InsideSpecAdapter(InsideAdapter):
    """Base class of the shipped adapters that change the frozen base's own forward (see the module
    docstring): the contract's :class:`~workbench.core.adapter.InsideAdapter` that reaches where the
    backbone's :class:`InsideSpec` says, with hooks and LoRA.

    Subclasses implement :meth:`attach` (install hooks on the :class:`InsideSpec`) and may use
    ``self.state`` (the engaged conditioning, set by :meth:`engaged`) in their hooks.
    """

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "spec", None)
        object.__setattr__(self, "state", None)  # what the hooks read while engaged
        object.__setattr__(self, "off", False)
        object.__setattr__(self, "_lora_layers", [])
        # Weights made at attach time (LoRA, copies, projections) are drawn from this seed, so the
        # adapter's init depends only on the RNG state when it was built (as a config promises).
        object.__setattr__(self, "_init_seed", int(torch.randint(0, 2**62, ())))

    def attach_base_model(self, base) -> None:
        if self.spec is not None:
            raise CompositionError(f"{type(self).__name__} is already attached to a base; "
                                   f"build a new adapter for each ComposedModel.")
        owner = getattr(base, OWNER, None)
        if owner is not None:
            raise CompositionError(
                f"This {type(base).__name__} already carries a {type(owner).__name__} adapter inside it "
                f"(hooks or LoRA layers); a base takes one inside adapter. Build a fresh backbone for this "
                f"{type(self).__name__} (e.g. TinyVideo.from_pretrained() again).")
        spec = reach_in(base)
        object.__setattr__(base, OWNER, self)
        object.__setattr__(self, "spec", spec)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._init_seed)
            self.attach(spec)

    def attach(self, spec: InsideSpec) -> None:
        raise NotImplementedError

    # -- the two switches --------------------------------------------------------------------
    def prepare_state(self, cond: Conditioning, x_t: torch.Tensor, t: torch.Tensor) -> object:
        """What the hooks need for one adapted forward (computed before the base runs)."""
        return cond

    @contextmanager
    def engaged(self, cond: Conditioning, x_t: torch.Tensor, t: torch.Tensor) -> Iterator[InsideSpecAdapter]:
        """The base's forward is the adapted one inside the block.

        The state stays set after the block (until the next ``engaged``), so a backward that
        recomputes checkpointed blocks sees the same hooks as the forward did.
        """
        object.__setattr__(self, "state", self.prepare_state(cond, x_t, t))
        self._changed()
        with self._switch(False):
            yield self

    @contextmanager
    def switched_off(self) -> Iterator[InsideSpecAdapter]:
        """The base is exactly the frozen base inside the block."""
        with self._switch(True):
            yield self

    def _changed(self) -> None:
        """The base's forward now computes something else for the same input: a base that caches its own
        calls (a diffusers backbone's ``forward_version``) must not reuse one made before."""
        base = self.bound_backbone
        if base is not None:
            vars(base)["forward_version"] = getattr(base, "forward_version", 0) + 1

    @contextmanager
    def _switch(self, off: bool):
        previous = self.off
        object.__setattr__(self, "off", off)
        if previous != off:
            self._changed()
        layers = self._lora_layers
        if layers and previous != off:
            for layer in layers:
                layer.enable_adapters(not off)
        try:
            yield
        finally:
            object.__setattr__(self, "off", previous)
            if previous != off:
                self._changed()
            if layers and previous != off:
                for layer in layers:
                    layer.enable_adapters(not previous)

    def export_lora(self, path) -> Path:
        """Write this adapter's LoRA for the base's ecosystem (see :meth:`LoraModules.export`)."""
        lora = getattr(self, "lora", None)
        if lora is None:
            raise CompositionError(
                f"{type(self).__name__} has no LoRA to export. "
                f"Use adapter type lora, or action_modulation with a lora: {{rank: ...}} block."
            )
        return lora.export(path, self.bound_backbone)

    @property
    def active(self) -> bool:
        return not self.off and self.state is not None


# -- peft's LoRA -----------------------------------------------------------------------------
@dataclass
class LoraSettings:
    """peft LoRA settings shared by ``lora`` and ``action_modulation``'s ``lora:`` block.

    ``rank``: the width of the low-rank update (>= 1); ``alpha``: its scale is ``alpha / rank``
    (``None``: ``alpha = rank``); ``dropout``: on the LoRA input; ``targets``: module names
    (peft's suffix match, e.g. ``to_q`` matches ``blocks.0.attn1.to_q``), ``None`` = the
    backbone's defaults (its ``inside_spec().lora_targets``, e.g. a DiT's ``to_q``, ``to_k``,
    ``to_v``, ``to_out.0``); ``init_from``: a LoRA file to start from (peft or diffusers format,
    ``.safetensors``).
    """

    rank: int = 4
    alpha: float | None = None
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    init_from: str | None = None

    def __post_init__(self):
        from workbench.config import check

        check(isinstance(self.rank, int) and self.rank >= 1, "rank",
              f"must be an int >= 1 (the width of LoRA's low-rank update), got {self.rank!r}. "
              f"Use e.g. rank: 4.")
        check(self.alpha is None or self.alpha > 0, "alpha",
              f"must be > 0 or null (= rank), got {self.alpha}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")
        if self.targets is not None:
            if isinstance(self.targets, str):
                self.targets = (self.targets,)
            self.targets = tuple(self.targets)
            check(len(self.targets) > 0, "targets", "is empty; list module names, or leave it unset for the "
                                                    "backbone's defaults.")

    def peft_config(self, targets: Sequence[str]):
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha if self.alpha is not None else self.rank,
                          lora_dropout=self.dropout, target_modules=list(targets), init_lora_weights=True)


def _layer_names(root: nn.Module) -> list[str]:
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    return [name for name, m in root.named_modules() if isinstance(m, kinds) and name]


def check_targets(root: nn.Module, targets: Sequence[str], backbone: str) -> None:
    """Every target matches at least one layer of ``root``, or a ConfigError listing the ones that exist."""
    names = _layer_names(root)
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if not missing:
        return
    # the short names peft matches: the last part of each path, with its parent when it is an index (to_out.0)
    suffixes = sorted({".".join(n.split(".")[-2:]) if n.split(".")[-1].isdigit() else n.split(".")[-1]
                       for n in names})
    hints = [f"'{m}' (did you mean {', '.join(repr(c) for c in close)}?)"
             if (close := difflib.get_close_matches(m, suffixes, n=3, cutoff=0.6)) else f"'{m}'"
             for m in missing]
    raise ConfigError(
        f"lora targets: {', '.join(hints)} match no layer of {backbone}. Layers LoRA can target there (name "
        f"suffixes): {listing(suffixes)}. Fix targets, or leave it unset for the backbone's defaults."
    )


class LoraModules(nn.Module):
    """peft's LoRA injected into a backbone's network, with the LoRA weights registered here.

    The layers live inside the base (that is where peft puts them); this module owns their
    ``lora_A`` / ``lora_B`` (and dropout), so they are the adapter's parameters, state dict and
    train/eval mode. Keys are the layers' paths with ``.`` written as ``-``.
    """

    ADAPTER = "default"

    def __init__(self, settings: LoraSettings, spec: InsideSpec, backbone: str):
        super().__init__()
        from peft import inject_adapter_in_model
        from peft.tuners.lora import LoraLayer

        targets = settings.targets or spec.lora_targets
        check_targets(spec.root, targets, backbone)
        self.settings = settings
        self.peft_config = settings.peft_config(targets)
        inject_adapter_in_model(self.peft_config, spec.root, adapter_name=self.ADAPTER)
        self.layers = nn.ModuleDict()
        found = []
        for name, module in spec.root.named_modules():
            if isinstance(module, LoraLayer):
                found.append(module)
                self.layers[name.replace(".", "-")] = nn.ModuleDict(
                    {"A": module.lora_A, "B": module.lora_B, "dropout": module.lora_dropout})
        self.found = found
        self.root_name = spec.root_name
        if settings.init_from:
            self.load(settings.init_from)

    def peft_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA weights under peft's key names (``<path>.lora_A.weight``), relative to the network."""
        out = {}
        for key, parts in self.layers.items():
            path = key.replace("-", ".")
            out[f"{path}.lora_A.weight"] = parts["A"][self.ADAPTER].weight
            out[f"{path}.lora_B.weight"] = parts["B"][self.ADAPTER].weight
        return out

    def export(self, path, base) -> Path:
        """Write the LoRA where ``path`` (a directory) says, in the format the base's ecosystem loads.

        A diffusers backbone (one with ``pipelines``): its pipeline class's ``save_lora_weights``
        (``pytorch_lora_weights.safetensors``, keys ``transformer.<path>.lora_A.weight``, the peft
        config as metadata), which ``pipe.load_lora_weights(path)`` loads. Otherwise the same
        layout with the network's name as the prefix (``denoiser.<path>...``). A ``manifest.json``
        beside the weights lists their size and SHA-256 (see :func:`workbench.integrity.publish`);
        ``init_from`` checks it.
        """
        import json
        import os

        from safetensors.torch import save as save_safetensors

        from workbench.integrity import publish, write_bytes

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        staging = out / f".tmp-export-{os.getpid()}"
        staging.mkdir(exist_ok=True)
        state = {k: v.detach().cpu().contiguous().clone() for k, v in self.peft_state_dict().items()}
        config = self.peft_config.to_dict()
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        pipelines = getattr(base, "pipelines", None)  # a diffusers backbone's: its pipeline's own LoRA format
        if pipelines:
            pipeline_class = type(next(iter(pipelines.values())))
            pipeline_class.save_lora_weights(str(staging), transformer_lora_layers=state,
                                             transformer_lora_adapter_metadata=config)
        else:
            write_bytes(staging / "pytorch_lora_weights.safetensors", save_safetensors(
                {f"{self.root_name}.{k}": v for k, v in state.items()},
                metadata={"lora_adapter_metadata": json.dumps({self.root_name: config})}))
        publish(staging, out)
        return out

    def load(self, path: str) -> None:
        """Start from a LoRA saved elsewhere: peft (``base_model.model.<path>.lora_A.weight``,
        ``<path>.lora_A.default.weight``) or diffusers (``transformer.<path>.lora_A.weight``) keys."""
        from safetensors.torch import load_file

        from workbench.errors import CheckpointError

        file = Path(path)
        if file.is_dir():
            found = sorted(file.glob("*.safetensors"))
            file = found[0] if len(found) == 1 else file / "pytorch_lora_weights.safetensors"
        if not file.is_file():
            raise CheckpointError(f"lora init_from: no LoRA file at {path!r}. "
                                  f"Give a .safetensors file written by exp.export_lora, "
                                  f"diffusers' save_lora_weights or peft's save_pretrained.")
        from workbench.integrity import listed_problem

        _, problem = listed_problem(file)
        if problem is not None:
            raise CheckpointError(f"lora init_from {str(file)!r} is damaged: {problem}. Nothing was loaded; "
                                  f"export the LoRA again (exp.export_lora) "
                                  f"or copy it again from where it was exported.")
        try:
            weights = load_file(str(file))
        except Exception as err:  # safetensors' own error type: a damaged file without a manifest to tell
            raise CheckpointError(f"lora init_from {str(file)!r} is not a readable safetensors file "
                                  f"({type(err).__name__}: {err}). Export the LoRA again.") from None
        theirs = {_strip_lora_key(k, self.root_name): v for k, v in weights.items()}
        ours = self.peft_state_dict()
        missing, unexpected = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
        shapes = [f"{k} {tuple(theirs[k].shape)} vs {tuple(v.shape)}" for k, v in ours.items()
                  if k in theirs and theirs[k].shape != v.shape]
        if missing or unexpected or shapes:
            raise CheckpointError(
                f"lora init_from {str(file)!r} does not fit this LoRA: missing {missing[:4]}, unexpected "
                f"{unexpected[:4]}, shape mismatches (file vs built) {shapes[:3]}. "
                f"Build the LoRA with the file's targets and rank."
            )
        with torch.no_grad():
            for k, v in ours.items():
                v.copy_(theirs[k])


def _strip_lora_key(key: str, root_name: str) -> str:
    for prefix in ("base_model.model.", "transformer.", "unet.", f"{root_name}."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
