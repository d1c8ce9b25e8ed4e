"""Loading a diffusers-format pipeline for a plugin: the checked directory, the tiny test fixture, the dtype.

No diffusers import here; :mod:`workbench.backbones.diffusers_bridge` builds on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.core import platform
from workbench.errors import CheckpointError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PRECISION = {"cpu": "float32", "cuda": "bfloat16"}  # what the diffusers video models run in, per device type


def pipeline_directory(path: str | Path, plugin: str, release: str, convert: str) -> Path:
    """``path`` as a diffusers pipeline directory, or a :class:`CheckpointError` saying how to get one."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise CheckpointError(
            f"{plugin}: {str(path)!r} is not a directory. Expected a diffusers-format pipeline directory "
            f"(model_index.json plus transformer/, vae/, text_encoder/, tokenizer/, scheduler/), e.g. the "
            f"{release} release downloaded with `huggingface-cli download {release} --local-dir DIR`."
        )
    if not (folder / "model_index.json").is_file():
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise CheckpointError(
            f"{plugin}: {str(folder)!r} has no model_index.json, so it is not a diffusers-format pipeline "
            f"(found: {', '.join(found) or 'nothing'}). Expected the diffusers layout: model_index.json plus "
            f"transformer/, vae/, text_encoder/, tokenizer/ and scheduler/ subfolders. "
            f"A raw upstream release must be converted first: {convert}"
        )
    return folder


def fixture_directory(name: str, write: Callable[[Path], Any]) -> Path:
    """``$WORKBENCH_CACHE/fixtures/NAME`` (default cache ``~/.cache/workbench``), written once by
    ``write(dir)``.

    The directory is written under a temporary name and renamed into place, so concurrent
    processes (test workers, notebooks) never see a half-written fixture.
    """
    import contextlib
    import os
    import shutil
    import tempfile

    root = Path(os.environ.get("WORKBENCH_CACHE") or "~/.cache/workbench").expanduser() / "fixtures"
    target = root / name
    if (target / "model_index.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        write(staging)
        with contextlib.suppress(OSError):  # another process finished first: its copy is identical
            os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def tiny_fixture_cli(argv: list[str] | None, *, prog: str, description: str, what: str,
                     save: Callable[[Path, int], Path]) -> None:
    """``python -m <plugin>.tiny OUT_DIR [--seed N]``: write a tiny pipeline and say where and how big."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("out_dir", help="directory to write (model_index.json, transformer/, vae/, ...)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = save(Path(args.out_dir), args.seed)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {what} to {out} ({size / 1024:.0f} KiB)")


def resolve_dtype(name: str, device: str | torch.device = "auto",
                  precision: Mapping[str, str | Sequence[str]] = PRECISION) -> torch.dtype:
    """The weights' dtype on ``device`` (``auto``: the best visible): ``auto`` = ``precision`` there."""
    return platform.resolve_dtype(name, platform.resolve_device(device), precision=precision)


def load_pipeline(folder: str | Path, *, plugin: str, device: str = "auto", dtype: str = "auto",
                  precision: Mapping[str, str | Sequence[str]] = PRECISION, float32: Sequence[str] = (),
                  skip: Sequence[str] = (), random_weights: bool = False, seed: int = 0):
    """Load a diffusers pipeline onto the target device in the target dtype; returns ``(pipeline, dtype)``.

    ``device`` / ``dtype`` are the backbone config's (``auto`` resolves through
    :mod:`workbench.core.platform` and ``precision``, the card's per-device precision), so a
    backbone on the CPU is float32 even on a machine with a GPU. ``float32``: components kept in
    float32 whatever the dtype (e.g. a VAE that upstream runs in float32). ``skip``: components
    not loaded (``None`` in the pipeline), e.g. a text encoder loaded later with :func:`load_component`.
    ``random_weights``: build every model of the directory from its ``config.json`` alone, with
    random weights (:func:`random_pipeline`): no weight files are read, and each model is held once.
    """
    from diffusers import DiffusionPipeline

    target, weights = platform.placement(device, dtype, precision, where=f"{plugin} config")
    if random_weights:
        return (random_pipeline(folder, device=target, dtype=weights, float32=float32, skip=skip, seed=seed),
                weights)
    dtypes = {"default": weights, **{name: torch.float32 for name in float32}} if float32 else weights
    loaded = DiffusionPipeline.from_pretrained(str(folder), dtype=dtypes, **{name: None for name in skip})
    for module in loaded.components.values():
        if isinstance(module, torch.nn.Module):
            module.to(target)
    return loaded, weights


def keep_in_float32(cls: type) -> Callable[[str], bool]:
    """Which parameters of a diffusers model class a reduced-precision load keeps in float32: those whose
    dotted name has one of the class's ``_keep_in_fp32_modules`` as a part (diffusers' own rule)."""
    keep = set(getattr(cls, "_keep_in_fp32_modules", None) or ())
    return lambda name: bool(keep) and any(part in keep for part in name.split("."))


def random_model(cls: type, config: Mapping[str, Any], *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0, float32: bool = False):
    """A diffusers model of class ``cls`` built from ``config`` with random weights, in eval mode.

    Built with its parameters on the meta device, then each materialised once in ``dtype`` (its
    ``_keep_in_fp32_modules`` in float32, everything in float32 with ``float32=True``) with the
    deterministic values of :func:`~workbench.backbones.random_weights.materialise`. Inside
    :func:`~workbench.backbones.random_weights.weights_on_meta` the parameters stay on meta.
    """
    from workbench.backbones.random_weights import empty_parameters, keeping_meta, materialise

    with empty_parameters():
        model = cls.from_config(dict(config))
    keep = (lambda name: True) if float32 else keep_in_float32(cls)
    materialise(model, dtype=dtype, device="meta" if keeping_meta() else device, seed=seed, float32=keep)
    return model.eval()


def random_pipeline(folder: str | Path, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32, float32: Sequence[str] = (), skip: Sequence[str] = (),
                    seed: int = 0):
    """The pipeline of a diffusers-format directory built from its configuration files alone, with random
    weights.

    Every component of ``model_index.json`` whose subfolder is there: diffusers models through
    :func:`random_model` (the components in ``float32`` kept in float32), schedulers and tokenizers
    from their files; components in ``skip``, listed as ``[null, null]`` or without a subfolder are
    ``None``. The pipeline class is ``model_index.json``'s ``_class_name``, given the file's other
    settings (e.g. ``expand_timesteps``). Each model gets its own seed (``seed`` and its name).
    """
    import importlib
    import inspect
    import json
    import zlib

    folder = Path(folder)
    index = json.loads((folder / "model_index.json").read_text())
    pipeline_cls = getattr(importlib.import_module("diffusers"), index["_class_name"])
    accepted = inspect.signature(pipeline_cls.__init__).parameters
    parts: dict[str, Any] = {}
    for name, entry in index.items():
        if name.startswith("_") or name not in accepted:
            continue
        if not (isinstance(entry, list) and len(entry) == 2):
            parts[name] = entry  # a pipeline setting
            continue
        sub = folder / name
        if None in entry or name in skip or not sub.is_dir():
            parts[name] = None
            continue
        cls = getattr(importlib.import_module(entry[0]), entry[1])
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            parts[name] = random_model(cls, cls.load_config(str(sub)), device=device, dtype=dtype,
                                       seed=seed + zlib.crc32(name.encode()), float32=name in float32)
        else:
            parts[name] = cls.from_pretrained(str(sub))
    return pipeline_cls(**parts)


def component_class(folder: str | Path, name: str) -> tuple[str, str] | None:
    """``(library, class name)`` of component ``name`` in a pipeline directory's ``model_index.json``
    (``None`` when the pipeline has none)."""
    import json

    entry = json.loads((Path(folder) / "model_index.json").read_text()).get(name)
    if not isinstance(entry, list) or len(entry) != 2 or None in entry:
        return None
    return entry[0], entry[1]


def load_component(folder: str | Path, name: str, *, device: torch.device | str, dtype: torch.dtype):
    """Component ``name`` of a pipeline directory (its subfolder, its class from ``model_index.json``),
    loaded on its own onto ``device`` in ``dtype``, in eval mode; ``None`` when the pipeline has none."""
    import importlib

    found = component_class(folder, name)
    if found is None:
        return None
    library, cls_name = found
    cls = getattr(importlib.import_module(library), cls_name)
    module = cls.from_pretrained(str(Path(folder) / name), dtype=dtype)
    return module.to(device).eval()


def parameter_count(folder: str | Path, name: str) -> int | None:
    """How many parameters component ``name`` holds, read from its safetensors headers (nothing is loaded);
    ``None`` when its weights are not safetensors files."""
    from safetensors import safe_open

    files = sorted((Path(folder) / name).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                count = 1
                for d in f.get_slice(key).get_shape():
                    count *= d
                total += count
    return total


@dataclass(frozen=True)
class TinyFixture:
    """A plugin's tiny random pipeline for tests and examples.

    ``build(seed)`` makes it (a diffusers pipeline, ``what`` in words); :meth:`save` writes it in
    the diffusers layout; :meth:`ensure` keeps one under ``$WORKBENCH_CACHE/fixtures/<name>``
    (``path: tiny``); :meth:`main` is ``prog OUT_DIR [--seed N]``.
    """

    name: str
    build: Callable[[int], Any]
    what: str
    prog: str

    def save(self, out_dir: str | Path, seed: int = 0) -> Path:
        """Write the pipeline built from ``seed`` to ``out_dir`` (diffusers layout, safetensors); return the
        path."""
        out = Path(out_dir)
        self.build(seed).save_pretrained(str(out), safe_serialization=True)
        return out

    def ensure(self) -> Path:
        """The pipeline's directory under ``$WORKBENCH_CACHE/fixtures`` (built once, atomically)."""
        return fixture_directory(self.name, self.save)

    def main(self, argv: list[str] | None = None) -> None:
        tiny_fixture_cli(argv, prog=self.prog,
                         description=f"Write {self.what} (random weights, diffusers layout).",
                         what=self.what, save=self.save)


__all__ = ["DTYPES", "TinyFixture", "component_class", "fixture_directory", "keep_in_float32",
           "load_component", "parameter_count", "pipeline_directory", "random_model", "random_pipeline",
           "resolve_dtype", "tiny_fixture_cli"]
