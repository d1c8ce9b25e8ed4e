"""Where fitted previews are kept: per backbone identity, in memory and on disk.

A preview depends only on what the backbone's decoder computes, so it is cached under
:func:`backbone_identity` (a hash of the decoder's weights and the config) in
:func:`cache_dir` as safetensors + JSON, written atomically (:func:`write_files`) and read back
with a clear error when damaged (:func:`read_files`). The linear and the tiny preview each keep
their own files there (:mod:`~workbench.inspect.previews.linear_preview`,
:mod:`~workbench.inspect.previews.tiny_preview`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import weakref
from pathlib import Path
from typing import Any

import torch

from workbench.core.backbone import BaseVideoModel, preview_decoder, preview_identity
from workbench.inspect.common import InspectError

_IDENTITIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cache_dir() -> Path:
    """Where fitted previews are kept: ``$WORKBENCH_CACHE/previews`` (default ``~/.cache/workbench``)."""
    root = os.environ.get("WORKBENCH_CACHE") or "~/.cache/workbench"
    return Path(root).expanduser() / "previews"


def clear_identities() -> None:
    """Forget the identities computed for backbone objects (they are recomputed on next use)."""
    _IDENTITIES.clear()


def backbone_identity(base: BaseVideoModel) -> str:
    """A hash of what the decoder computes: its weights, the base's own buffers, and the config.

    The decoder is :func:`~workbench.core.backbone.preview_decoder`'s (by default the first of the
    submodules ``vae`` / ``autoencoder`` / ``first_stage_model`` / ``decoder`` that exists; else the
    whole state dict is hashed). A backbone declaring
    :class:`~workbench.core.capabilities.Previews` may return a ``preview_identity()`` instead (e.g.
    its VAE checkpoint's hash) to skip hashing. Computed once per backbone object: the base is frozen.
    """
    custom = preview_identity(base)
    if custom is not None:
        return str(custom)
    if base in _IDENTITIES:
        return _IDENTITIES[base]
    h = hashlib.sha256()
    h.update(f"{type(base).__module__}.{type(base).__qualname__}".encode())
    config = getattr(base, "config", None)
    if dataclasses.is_dataclass(config):
        # where the weights came from, where they run and whether the denoiser is compiled do not change
        # what the decoder computes
        fields = {k: v for k, v in dataclasses.asdict(config).items()
                  if k not in ("weights", "device", "dtype", "compile")}
        h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    decoder = preview_decoder(base)
    if decoder is None:
        tensors = base.state_dict()
    else:
        tensors = dict(decoder.state_dict())
        tensors.update({f"@{k}": v for k, v in base.named_buffers(recurse=False)})
        tensors.update({f"@{k}": v for k, v in base.named_parameters(recurse=False)})
    for name in sorted(tensors):
        value = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        h.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    identity = h.hexdigest()[:24]
    _IDENTITIES[base] = identity
    return identity


def read_files(weights: Path, meta_path: Path, what: str, refit: str) -> tuple[dict, dict] | None:
    """``(meta, tensors)`` of a cached preview's two files; ``None`` when either is missing.

    An unreadable pair is an error naming the file and the fix (``refit``: the call that remakes it).
    """
    from safetensors.torch import load_file

    if not (weights.exists() and meta_path.exists()):
        return None
    try:
        return json.loads(meta_path.read_text()), load_file(str(weights))
    except Exception as err:  # safetensors / json raise their own types for corrupt files
        raise InspectError(
            f"The cached {what} {weights} is unreadable ({err}). "
            f"Delete it (and {meta_path.name}) or call {refit}."
        ) from err


def write_files(weights: Path, meta_path: Path, tensors: dict[str, torch.Tensor],
                meta: dict[str, Any]) -> Path:
    """Write a preview's weights and metadata atomically (each file renamed into place); returns
    ``weights``."""
    from safetensors.torch import save_file

    weights.parent.mkdir(parents=True, exist_ok=True)
    tmp_w, tmp_m = weights.with_suffix(".safetensors.tmp"), meta_path.with_suffix(".json.tmp")
    save_file(tensors, str(tmp_w), metadata={"workbench": json.dumps(meta)})
    tmp_m.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_w, weights)
    os.replace(tmp_m, meta_path)
    return weights
