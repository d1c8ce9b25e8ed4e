"""What a diffusers-native backbone needs around diffusers' own pipeline (no diffusers import here).

* :class:`Injection` wraps the pipeline's transformer forward for the length of one ``generate``:
  each call the pipeline makes is handed to the composition (``compose_fn``), one batch half at a
  time with that half's own conditions, and re-joined in the pipeline's order. The scheduler's
  ``step`` is observed (never changed) for the step record; steps reach ``on_step`` from the
  pipeline's ``callback_on_step_end``.
* :class:`_PipelineCall` makes the frozen base's prediction inside ``generate`` *the pipeline's own
  transformer call*, made once and only if the composition asks for it: a zero adapter then
  reproduces the pipeline bit for bit, and a replayed step (a fork's prefix) costs no call at all.
* Loading and data helpers shared by the plugins.

Every diffusers-native plugin builds on this module; it is part of workbench's public API for
plugin authors and never imports diffusers itself (``import workbench`` does not load it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from workbench.core import BaseVideoModel, Batch, StepRecord
from workbench.core import platform
from workbench.core.backbone import as_video  # noqa: F401  (part of this module's API for plugins)
from workbench.errors import CheckpointError, CompositionError, DataError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PRECISION = {"cpu": "float32", "cuda": "bfloat16"}  # what the diffusers video models run in, per device type
SIGNAL_KEYS = ("action", "proprio", "ee_pos")  # per-frame signals passed through to adapters


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
            f"transformer/, vae/, text_encoder/, tokenizer/ and scheduler/ subfolders. A raw upstream release must be "
            f"converted first: {convert}"
        )
    return folder


def fixture_directory(name: str, write: Callable[[Path], Any]) -> Path:
    """``$WORKBENCH_CACHE/fixtures/NAME`` (default cache ``~/.cache/workbench``), written once by ``write(dir)``.

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
                  precision: Mapping[str, str | Sequence[str]] = PRECISION, float32: Sequence[str] = ()):
    """Load a diffusers pipeline onto the target device in the target dtype; returns ``(pipeline, dtype)``.

    ``device`` / ``dtype`` are the backbone config's (``auto`` resolves through
    :mod:`workbench.core.platform` and ``precision``, the card's per-device precision), so a
    backbone on the CPU is float32 even on a machine with a GPU. ``float32``: components kept in
    float32 whatever the dtype (e.g. a VAE that upstream runs in float32).
    """
    from diffusers import DiffusionPipeline

    target, weights = platform.placement(device, dtype, precision, where=f"{plugin} config")
    dtypes = {"default": weights, **{name: torch.float32 for name in float32}} if float32 else weights
    loaded = DiffusionPipeline.from_pretrained(str(folder), dtype=dtypes)
    for module in loaded.components.values():
        if isinstance(module, torch.nn.Module):
            module.to(target)
    return loaded, weights


def pool_to_latent_frames(signal: torch.Tensor, ratio: int) -> torch.Tensor:
    """Per-frame ``(B, T, D)`` → per-latent-frame ``(B, 1 + (T - 1) / r, D)``: the causal VAE's first
    latent frame covers frame 0, each later one the next ``r`` frames; each gets its frames' mean."""
    first = signal[:, :1]
    rest = signal[:, 1:].unflatten(1, (-1, ratio)).mean(dim=2)  # (B, T' - 1, D)
    return torch.cat([first, rest], dim=1)


def check_video_size(shape: Sequence[int], key: str, *, plugin: str, model: str, temporal: int, spatial: int,
                     patch: int, max_frames: int, example: str) -> None:
    """``(T, H, W)`` of ``key`` fits a causal video VAE (``1 + temporal k`` frames) and the patching, or a DataError.

    ``model``: the model's name in the message; ``example``: a size that works for the real model.
    """
    frames, height, width = shape
    multiple = spatial * patch
    problems = []
    if (frames - 1) % temporal:
        sizes = ", ".join(str(1 + k * temporal) for k in range(4))
        problems.append(f"{frames} frames (allowed: 1 + {temporal}k: {sizes}, ..., {max_frames})")
    if height % multiple or width % multiple:
        problems.append(f"{height}x{width} pixels (height and width must be multiples of {multiple})")
    if problems:
        raise DataError(
            f"{plugin}: '{key}' has {' and '.join(problems)}; received shape (T, H, W) = {tuple(shape)}. "
            f"{model}'s VAE compresses {temporal}x in time after the first frame and {spatial}x in space, with "
            f"{patch}x{patch} transformer patches. Crop or resize the clips, e.g. a Meta-World window of 9 frames "
            f"at 64x64, or {example} for the real model."
        )


def requested_frames(raw: Mapping[str, Any], default: int) -> int:
    """How many frames a generation request without video asks for: its signals' length, else ``frames``."""
    for key in ("action", "actions", *SIGNAL_KEYS):
        if raw.get(key) is not None:
            return int(torch.as_tensor(raw[key]).shape[1])
    return int(raw.get("frames", default))


def add_signals(cond: dict[str, Any], raw: Mapping[str, Any], *, batch_size: int, frames: int, ratio: int,
                device: torch.device, plugin: str) -> set[str]:
    """Put the raw per-frame signals into ``cond``; returns their (per-frame) keys.

    Each of ``action`` (or ``actions``), ``proprio``, ``ee_pos`` ``(B, T, D)`` is supplied pooled
    onto latent frames (``action``, see :func:`pool_to_latent_frames`) and at full rate
    (``action_frames``).
    """
    keys = set()
    for key in SIGNAL_KEYS:
        value = raw.get(key, raw.get("actions") if key == "action" else None)
        if value is None:
            continue
        value = torch.as_tensor(value, device=device).float()
        if value.ndim != 3 or value.shape[0] != batch_size or value.shape[1] != frames:
            raise DataError(f"{plugin}: '{key}' must be (B, T, D) with B={batch_size} and T={frames} frames, "
                            f"got {tuple(value.shape)}.")
        cond[key] = pool_to_latent_frames(value, ratio)
        cond[f"{key}_frames"] = value
        keys |= {key, f"{key}_frames"}
    return keys


def prompts_from(raw: Mapping[str, Any], key: str, default: str | None, template: str, batch_size: int,
                 plugin: str) -> list[str]:
    """One prompt per clip: ``raw[key]`` (a str, or one str per clip) put into ``template``, else ``default``."""
    value = raw.get(key)
    if value is None:
        if default is None:
            raise DataError(
                f"{plugin}.prepare_batch needs the text condition: a '{key}' entry (a str, or a list of {batch_size} "
                f"str), precomputed 'prompt_embeds' (B, L, D), or a default prompt in the backbone config "
                f"(prompt: '...'). The batch has keys {sorted(raw)}. Add one of these (for Meta-World clips, "
                f"prompt_key: task reads the task name)."
            )
        return [default] * batch_size
    if isinstance(value, str):
        return [template.format(value)] * batch_size
    if not (isinstance(value, Sequence) and all(isinstance(v, str) for v in value)) or len(value) != batch_size:
        raise DataError(f"{plugin}: '{key}' must be a str or a list of {batch_size} str (one per clip), got "
                        f"{type(value).__name__} {value!r:.80}.")
    return [template.format(v) for v in value]


def batch_size_of(raw: Mapping[str, Any], prompt_key: str) -> int:
    """How many clips a generation request without video asks for (signals, embeddings or prompts; else 1)."""
    for key in ("prompt_embeds", "action", "actions", *SIGNAL_KEYS):
        if raw.get(key) is not None:
            return int(torch.as_tensor(raw[key]).shape[0])
    prompts = raw.get(prompt_key)
    if isinstance(prompts, Sequence) and not isinstance(prompts, str):
        return len(prompts)
    return int(raw.get("batch_size", 1))


class _PipelineCall:
    """One transformer call made by the pipeline, evaluated at most once and only if asked for.

    ``pieces`` are the tensors handed to the composition (one per batch half) with their rows of
    the call (``None``: all of them); ``denoise`` called on one of them returns its rows of this
    single call, made with the pipeline's own arguments.
    """

    def __init__(self, run: Callable[[], torch.Tensor], pieces: Sequence[tuple[torch.Tensor, slice | None]]):
        self.run, self.pieces, self.output = run, list(pieces), None

    def output_for(self, x: torch.Tensor) -> torch.Tensor | None:
        for piece, rows in self.pieces:
            if piece is x:
                if self.output is None:
                    self.output = self.run()
                out = self.output if rows is None else self.output[rows]
                return out if out.dtype == x.dtype else out.to(x.dtype)
        return None


class Injection:
    """The composition wrapped around a pipeline's transformer and scheduler for one ``generate``.

    Installed with ``with injection.installed(pipe):``; everything is restored when the block ends.
    The transformer's forward is replaced by :meth:`forward` (compose instead of predict); the
    scheduler's ``step`` is only observed: it counts steps, and keeps the guided prediction and the
    sample it updates, which the step record needs and diffusers' step callback does not carry.
    Pass :attr:`callback` to the pipeline: with an ``on_step`` it reports each step from the
    pipeline's ``callback_on_step_end``; without one the pipeline runs with no callback at all.
    """

    def __init__(self, backbone: DiffusersBackbone, batch: Batch, uncond: Batch | None, compose_fn, on_step,
                 steps: int):
        self.backbone, self.batch, self.uncond, self.compose_fn = backbone, batch, uncond, compose_fn
        self.on_step, self.steps = on_step, steps
        self.step, self.calls_in_step = 0, 0
        self.sigmas: torch.Tensor | None = None
        self.sigma_rows: dict[tuple, torch.Tensor] = {}  # (step, rows, device) -> (rows,), made once
        self.output_dtype = backbone.transformer.dtype  # read once: diffusers walks the parameters for it
        self.observed: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.native_forward = None

    @contextmanager
    def installed(self, pipe):
        transformer, scheduler = pipe.transformer, pipe.scheduler
        self.pipe = pipe
        saved = {(transformer, "forward"): transformer.__dict__.get("forward"),
                 (scheduler, "step"): scheduler.__dict__.get("step")}
        self.native_forward, native_step = transformer.forward, scheduler.step

        def observed_step(model_output, timestep, sample, *args, **kwargs):
            result = native_step(model_output, timestep, sample, *args, **kwargs)
            self.observed = (self.step, sample, model_output)
            self.step, self.calls_in_step = self.step + 1, 0
            return result

        transformer.forward = self.forward
        scheduler.step = observed_step
        try:
            yield self
        finally:
            self.backbone._pending = None
            for (obj, name), value in saved.items():
                if value is None:
                    obj.__dict__.pop(name, None)
                else:
                    setattr(obj, name, value)

    def sigma(self, like: torch.Tensor, rows: int, step: int | None = None) -> torch.Tensor:
        """Step ``step``'s (default: the current one's) noise level σ as ``(rows,)`` float32 (objective units)."""
        key = (self.step if step is None else step, rows, like.device)
        sigma = self.sigma_rows.get(key)
        if sigma is None:
            if self.sigmas is None or self.sigmas.device != like.device:
                self.sigmas = self.pipe.scheduler.sigmas.to(device=like.device, dtype=torch.float32)
            self.sigma_rows[key] = sigma = self.sigmas[key[0]].expand(rows)
        return sigma

    @property
    def callback(self) -> dict:
        """The pipeline's step-callback arguments: only a recording (an ``on_step``) needs them."""
        if self.on_step is None:
            return {}
        return dict(callback_on_step_end=self.on_step_end, callback_on_step_end_tensor_inputs=["latents"])

    def compose(self, call: Callable[[], torch.Tensor], hidden: torch.Tensor,
                halves: Sequence[tuple[slice, Batch]]) -> torch.Tensor:
        """Compose each half of one transformer call with its own batch; re-join them in call order.

        ``halves``: ``(rows, batch)`` in the order the composition sees them (the conditional half
        first, so a recording keeps the conditional prediction of each step).
        """
        x = hidden.to(self.batch.latents.dtype)
        whole = len(halves) == 1 and halves[0][0] == slice(0, x.shape[0])
        pieces = [(x, None)] if whole else [(x[rows], rows) for rows, _ in halves]
        # The hot path of every sampling step: the pending call is set on the backbone's __dict__
        # directly (nn.Module.__setattr__ would first check for parameters, buffers and modules).
        state = self.backbone.__dict__
        state["_pending"] = _PipelineCall(call, pieces)
        outputs: dict[int, torch.Tensor] = {}
        try:
            for (piece, _), (rows, batch) in zip(pieces, halves):
                outputs[rows.start or 0] = self.compose_fn(piece, self.sigma(piece, piece.shape[0]), batch)
        finally:
            state["_pending"] = None
        joined = [outputs[k] for k in sorted(outputs)]
        out = joined[0] if len(joined) == 1 else torch.cat(joined)
        return out if out.dtype == self.output_dtype else out.to(self.output_dtype)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def on_step_end(self, pipe, index: int, timestep, callback_kwargs: dict) -> dict:
        """diffusers' ``callback_on_step_end``: report step ``index`` to ``on_step`` as a :class:`StepRecord`."""
        if self.observed is None or self.observed[0] != index:
            raise CompositionError(
                f"{type(self.backbone).__name__}: the pipeline reported step {index} without a scheduler step for it "
                f"(expected step {self.step - 1}); this diffusers version calls the scheduler or the step callback "
                f"differently from the one the plugin was written for. Pin the diffusers version in constraints.txt."
            )
        _, sample, prediction = self.observed
        self.observed = None
        self.on_step(StepRecord(index, self.steps, self.sigma(sample, sample.shape[0], index), sample, prediction,
                                callback_kwargs["latents"]))
        return {}


class DiffusersBackbone(BaseVideoModel):
    """What the diffusers-native backbones share: the pipeline's modules, and a lazily evaluated
    base call inside ``generate``."""

    _pending: _PipelineCall | None = None

    def adopt_components(self, parts: Mapping[str, Any]) -> None:
        """Own the loaded pipeline's modules (frozen, in eval mode, moved and counted with the backbone).

        ``transformer``, ``vae`` and ``scheduler`` are required, ``text_encoder`` and ``tokenizer``
        optional (precomputed embeddings). Pipelines built over them afterwards only borrow them.
        """
        self.transformer = parts["transformer"]
        self.vae = parts["vae"]
        self.text_encoder = parts.get("text_encoder")
        self.tokenizer = parts.get("tokenizer")
        self.scheduler = parts["scheduler"]
        for module in (self.transformer, self.vae, self.text_encoder):
            if module is not None:
                module.eval()

    def native_prediction(self, x_t: torch.Tensor) -> torch.Tensor | None:
        """The pipeline's own transformer output for ``x_t`` when ``x_t`` is what the injected call handed out."""
        pending = self._pending
        return None if pending is None else pending.output_for(x_t)


def transformer_output(sample: torch.Tensor):
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)


def uncond_batch(batch: Batch, negative: torch.Tensor, **extra: torch.Tensor) -> Batch:
    """The batch the unconditional branch is composed with: the negative prompt, the signals dropped.

    Dropped means zeros, exactly what a condition's dropout feeds the adapter in training, so an
    adapter trained with condition dropout has learned what "unconditional" looks like.
    """
    cond = dict(batch.cond)
    cond["prompt_embeds"] = negative
    cond.update(extra)
    for key in [k for k in cond if k.removesuffix("_frames") in SIGNAL_KEYS]:
        if isinstance(cond[key], torch.Tensor):
            cond[key] = torch.zeros_like(cond[key])
    return Batch(latents=batch.latents, cond=cond, loss_mask=batch.loss_mask, per_frame=batch.per_frame,
                 meta={**batch.meta, "branch": "uncond"})


