"""The instruments at real size: each plugin's real architecture in bf16, random weights, on the CPU.

For each model the real configuration shipped with its plugin is built with random weights
(parameters created on the meta device, each materialised once in bf16), at the smallest spatial
size the model accepts, in a process of its own (so that its peak resident memory is its own),
and the instruments a researcher would use are run on it (``--quick``, which judges nothing, runs
the three tiny configurations one after the other in one process: one interpreter start and one
import of diffusers instead of three; one fit step each and one distillation step):

* record 3 sampler steps; the same run unrecorded; a fork at step 1; one ablation-slider move
  (``action``); a tiny preview distilled from the real VAE and one decode through it;
* a base denoise call through the workbench (``ComposedModel.predict``, adapter off) and the same
  module called by hand, interleaved, medians;
* two ``fit`` steps each of ``latent_residual``, ``lora``, ``action_modulation`` and ``controlnet``
  with gradient checkpointing (the adapter's, and the denoiser's own where it has one), and
  ``export_lora``.

It measures, per model: peak RSS while loading over the weights' bytes (goal <= 1.15: the base is
never held twice); the peak RSS of each fit over weights + trainable state + the activation
estimate of ``workbench.train.memory`` traced at the same shapes (reported; goal within ±25%); the
LoRA layers injected against the real module names targeted (exact); recorded == unrecorded and
the fork's prefix == the recorded prefix (bit-exact); and the denoise-call ratio (goal <= 1.02).
Peaks are the process's ``VmHWM``, reset before each phase (``/proc/self/clear_refs``), minus the
resident memory before the model was built (the interpreter and its libraries).

    python benchmarks/real_size.py                        # all three (make bench-real), ~15 min each
    python benchmarks/real_size.py --models dynamicrafter
    python benchmarks/real_size.py --quick                # the same code on the tiny configurations

Text encoders are not built: Wan2.2's UMT5-XXL and EasyAnimate's Qwen2-VL are replaced by random
``prompt_embeds`` of their output shape (Wan: ``(1, 512, 4096)``; EasyAnimate: ``(1, L, 3584)``,
``L`` below). DynamiCrafter's towers (CLIP text and vision, the resampler) are all built and run; its
prompts are token ids (no tokenizer download). EasyAnimate is the V5.1 12B architecture at 28 of its
48 layers (6.9 B parameters, the 7B release's size; the 12B does not fit 24 GiB beside its VAE).
Results go to ``benchmarks/real_size/results/<model>.json`` and a table is printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "real_size" / "results"
GIB = 2**30
MODELS = ("dynamicrafter", "wan22", "easyanimate")
ADAPTERS = ("latent_residual", "lora", "action_modulation", "controlnet")
EASYANIMATE_LAYERS = 28
EASYANIMATE_TEXT = 64  # prompt tokens: the joint attention runs them through every layer (see the docs' table)


# -- memory of this process ------------------------------------------------------------------
def status(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) * 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current resident size


def release() -> None:
    """Collect garbage and hand freed heap memory back to the system (glibc keeps freed blocks under its
    mmap threshold in the process otherwise, and the next phase's peak would count them)."""
    import contextlib
    import ctypes

    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def available() -> int:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"MemAvailable:\s+(\d+) kB", text).group(1)) * 1024


# -- the models --------------------------------------------------------------------------------
def easyanimate_config(folder: Path, layers: int) -> Path:
    """The shipped EasyAnimate configuration with ``layers`` transformer layers, written to ``folder``."""
    import workbench_easyanimate.backbone

    source = Path(workbench_easyanimate.backbone.__file__).parent / "real"
    shutil.copytree(source, folder, dirs_exist_ok=True)
    config = json.loads((folder / "transformer" / "config.json").read_text())
    config["num_layers"] = config["mmdit_layers"] = layers
    (folder / "transformer" / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def setup(name: str, quick: bool, tmp: Path) -> dict:
    """What to build for model ``name``: the backbone block, the generation and training inputs."""
    import torch

    g = torch.Generator().manual_seed(0)
    common = {"random_weights": True, "device": "cpu", "dtype": "bfloat16", "steps": 3}
    if name == "dynamicrafter":
        # real: 64 px, the VAE's 8x and the U-Net's three downsamplings; tiny: 32 px, its VAE's 4x and one level
        # (the smallest multiple of 4 whose latents, 8x8, keep the adapters' and the preview's convolutions whole),
        # and 4 frames (the temporal layers run on any count)
        size, frames = (32, 4) if quick else (64, 16)
        config = {**common, "path": "tiny" if quick else "real", "variant": "512", "prompt": "a robot arm",
                  "height": size, "width": size, "num_frames": frames}
        kind, residual, text = "dynamicrafter", "dynamicrafter_latent_residual", {"prompt": "a robot arm"}
    elif name == "wan22":
        size, frames = 32, 5  # 32 px: the VAE's 16x and the 2x2 patches; 2 latent frames (the tiny one's as well)
        config = {**common, "path": "tiny" if quick else "real", "height": size, "width": size, "num_frames": frames}
        kind, residual = "wan22_ti2v", "wan22_latent_residual"
        width, length = (16, 8) if quick else (4096, 512)
        text = {"prompt_embeds": torch.randn(1, length, width, generator=g) * 0.1,
                "negative_prompt_embeds": torch.randn(1, length, width, generator=g) * 0.1}
    else:
        size, frames = 32, 5  # 32 px: the VAE's 8x and the 2x2 patches; 2 latent frames (the tiny one's as well)
        path = "tiny" if quick else str(easyanimate_config(tmp / "easyanimate", EASYANIMATE_LAYERS))
        config = {**common, "path": path, "height": size, "width": size, "num_frames": frames}
        kind, residual = "easyanimate", "easyanimate_latent_residual"
        width, length = (16, 8) if quick else (3584, EASYANIMATE_TEXT)
        text = {"prompt_embeds": torch.randn(1, length, width, generator=g) * 0.1,
                "negative_prompt_embeds": torch.randn(1, length, width, generator=g) * 0.1}
    video = torch.rand(1, 3, frames, size, size, generator=g) * 2 - 1
    action = torch.rand(1, frames, 4, generator=g) * 2 - 1
    generation = {**text, "action": action, "frames": frames}
    if name == "easyanimate":
        generation.update(height=size, width=size)
    else:
        generation["image"] = video[:, :, 0]
    return {"kind": kind, "config": config, "residual": residual, "train": [{**text, "video": video, "action": action}],
            "generation": generation, "size": size, "frames": frames}


def adapter_block(name: str, residual: str, channels: int) -> tuple[str, dict]:
    return {"latent_residual": (residual, {"channels": channels, "width": 32, "depth": 1, "dim": 4}),
            "lora": ("lora", {"rank": 16}),
            "action_modulation": ("action_modulation", {"hidden": 64, "lora": {"rank": 16}}),
            "controlnet": ("controlnet", {"blocks": 1})}[name]


def median_ratio(a, b, repeats: int) -> tuple[float, float, float]:
    ta, tb = [], []
    for i in range(repeats):
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            start = time.process_time()
            fn()
            out.append(time.process_time() - start)
    return statistics.median(ta) / statistics.median(tb), statistics.median(ta), statistics.median(tb)


def hand_call(base, kind: str, x, t, cond):
    """The denoiser module called directly with the arguments ``base.denoise`` gives it (prepared outside)."""
    import torch

    if kind == "wan22_ti2v":
        hidden = x.clone()
        hidden[:, :, 0] = cond["first_frame"].to(x.dtype)
        dtype = base.transformer.dtype
        args = dict(hidden_states=hidden.to(dtype), timestep=base.token_timesteps(t, x.shape),
                    encoder_hidden_states=cond["prompt_embeds"].to(dtype), return_dict=False)
        return lambda: base.transformer(**args)[0]
    if kind == "easyanimate":
        dtype = base.transformer.dtype
        args = (x.to(dtype), (t.float() * base.train_timesteps).to(dtype))
        text = cond["prompt_embeds"].to(dtype)
        return lambda: base.transformer(*args, encoder_hidden_states=text, return_dict=False)[0]
    unet = base.model.unet
    dtype = unet.out[2].weight.dtype
    inp = torch.cat([x, cond["concat"].to(x.dtype)], dim=1).to(dtype)
    context = cond["context"].to(dtype)
    return lambda: unet(inp, t, context=context, fs=cond["fs"])


# -- one model, in its own process -------------------------------------------------------------
def child(name: str, quick: bool, out: Path) -> int:
    import torch

    torch.set_num_threads(1)
    from workbench import AdapterExperiment, ComposedModel, GatedResidual, TrainingConfig
    from workbench.backbones.random_weights import parameter_bytes
    from workbench.config import build
    from workbench.inspect import Ablation, fit_preview, record
    from workbench.train.memory import lora_targets, meta_backbone, trace_training_step

    result: dict = {"model": name, "quick": quick, "times_s": {}}
    times = result["times_s"]
    clock = time.time()

    def lap(label: str) -> None:
        nonlocal clock
        now = time.time()
        times[label] = round(now - clock, 1)
        clock = now
        print(f"  [{name}] {label}: {times[label]} s", flush=True)

    gc.freeze()  # what is alive now (the interpreter, torch, workbench) is never garbage: no collection walks it
    tmp = Path(tempfile.mkdtemp(prefix="real-size-"))
    spec = setup(name, quick, tmp)
    kind = spec["kind"]

    def fresh_base():
        """The model built again (the same seed: the same weights); a base takes one inside adapter."""
        base = build("backbone", kind, spec["config"])
        if kind == "dynamicrafter":  # prompts as token ids: the rehearsal downloads no tokenizer
            sizes = base.model.sizes
            base.tokenize = lambda prompts: torch.randint(1, sizes.text_vocab - 2, (len(prompts), sizes.text_length),
                                                          generator=torch.Generator().manual_seed(1))
        return base

    baseline = status("VmRSS")
    reset_peak()
    base = fresh_base()
    towers = base.frozen_encoders()
    load_peak = status("VmHWM") - baseline
    weights = parameter_bytes(base) + sum(parameter_bytes(m) for m in towers)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in base.parameters()})
    result.update(model_id=base.card.model_id, baseline_rss=baseline, weights=weights, weight_dtypes=dtypes,
                  parameters=sum(p.numel() for p in base.parameters()) + sum(
                      p.numel() for m in towers for p in m.parameters()),
                  load_peak=load_peak, load_ratio=load_peak / weights,
                  size=f"{spec['size']}x{spec['size']}, {spec['frames']} frames")
    del towers  # the backbone keeps them (loaded on first use)
    lap("build (random weights, bf16)")
    channels = base.latent_shape(base.clip())[0]

    # -- instruments on a nonzero latent_residual behind an open gate ----------------------------
    residual_name, residual_config = adapter_block("latent_residual", spec["residual"], channels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        adapter = build("adapter", residual_name, residual_config)
        with torch.no_grad():
            for p in adapter.parameters():
                if p.abs().sum() == 0:
                    p.normal_(0, 0.02)
    model = ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective())
    batch = base.prepare_batch(spec["generation"])
    lap("prepare the generation batch (VAE, conditioning towers)")
    traj = record(model, batch, steps=3, seed=0)
    lap("record 3 steps")
    plain = model.generate(batch, steps=3, generator=torch.Generator(device=batch.latents.device).manual_seed(0))
    lap("generate 3 steps unrecorded")
    fork = traj.fork(at=1)
    lap("fork at step 1")
    prefix = all(torch.equal(fork[0].get(f), traj[0].get(f)) for f in ("x_t", "composed"))
    result["bit_exact"] = {"recorded == unrecorded": bool(torch.equal(traj.final, plain)),
                           "fork prefix == recorded prefix": bool(prefix),
                           "fork final == recorded final": bool(torch.equal(fork.final, traj.final))}
    ablation = Ablation(traj, step=1, condition="action")
    start = time.time()
    ablation.set(0, 0.5)
    change = ablation.change()
    result["ablation"] = {"rms_change": change, "seconds": round(time.time() - start, 2),
                          "recompose_calls": ablation.evaluations}
    lap("ablation slider move")
    n_fit = 1 if quick else 2
    preview = fit_preview(base, kind="tiny", latent_shape=tuple(batch.latents.shape[1:]), n_fit=n_fit, n_heldout=1,
                          steps=1 if quick else 20, cache=False)
    lap(f"distil a tiny preview ({n_fit} clip{'s' * (n_fit > 1)}, real VAE)")
    start = time.time()
    frames = traj.frames(len(traj) - 1, decode="tiny")
    result["tiny_preview"] = {"decode_seconds": round(time.time() - start, 3), "frames": list(frames.shape),
                              "psnr_db": getattr(preview, "psnr", None)}
    lap("tiny-preview decode")

    # -- a base denoise call: through the workbench vs by hand ----------------------------------------
    x = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(2))
    t = (torch.tensor([500]) if kind == "dynamicrafter" else torch.tensor([0.5]))
    with torch.no_grad():
        def through(model=model):
            return model.predict(x, t, batch, with_adapter=False).base

        by_hand = hand_call(base, kind, x, t, batch.cond)
        assert torch.equal(through(), by_hand().to(x.dtype)[:, : x.shape[1]])  # the same call
        ratio, a, b = median_ratio(through, by_hand, 1 if quick else 3)
    result["denoise"] = {"ratio": ratio, "workbench_s": a, "by_hand_s": b}
    lap("denoise: workbench vs by hand")

    # -- fits ----------------------------------------------------------------------------------------
    del traj, fork, ablation, plain, preview, frames, through, by_hand, model, adapter
    meta = meta_backbone(kind, spec["config"], torch.bfloat16)
    targets = sorted(n for n, _ in lora_targets(base))
    result["fits"] = {}
    has_checkpointing = hasattr(base.inside_spec().root, "enable_gradient_checkpointing")
    fit_steps = 1 if quick else 2  # (quick: one step proves the path; the second is the peak's steady state)
    for which in ADAPTERS:
        adapter_name, adapter_config = adapter_block(which, spec["residual"], channels)
        if which != "latent_residual":  # an inside adapter takes a base of its own
            del base
            release()
            base = fresh_base()
            lap(f"build again for {which}")
        release()
        if has_checkpointing:
            base.inside_spec().root.enable_gradient_checkpointing()
        exp = AdapterExperiment(base=base, adapter=build("adapter", adapter_name, adapter_config),
                                training=TrainingConfig(steps=fit_steps, batch_size=1, learning_rate=1e-4,
                                                        progress=False,
                                                        gradient_checkpointing=True, sync_every=1, device="cpu"))
        trainable = exp.model.trainable_parameters()
        state = sum(p.numel() * p.element_size() * 4 for p in trainable)  # weights, gradients, two moments
        fit_batch = base.prepare_batch(spec["train"][0])
        if exp.model.adapter.inside:
            latents = torch.empty(fit_batch.latents.shape, device="meta")
            cond = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v
                    for k, v in fit_batch.cond.items()}
            t, _ = meta.planning_inputs(latents)  # the time a training step's denoise call takes, on meta
            trace = trace_training_step(meta, latents, t, cond)
            activations = trace.checkpointed if has_checkpointing else trace.total
        else:
            activations = 0  # the base runs without gradients; the adapter's own are small
        reset_peak()
        before = status("VmRSS")
        exp.fit(spec["train"], steps=fit_steps)
        peak = status("VmHWM") - baseline
        estimate = weights + state + activations
        entry = {"peak": peak, "rss_before": before - baseline, "estimate": estimate, "activations": activations,
                 "trainable_state": state, "trainable_parameters": sum(p.numel() for p in trainable),
                 "ratio": peak / estimate, "losses": [float(v) for v in exp.loss_history]}
        if which == "lora":
            injected = sorted(f"{k.replace('-', '.')}" for k in exp.model.adapter.lora.layers)
            entry["lora"] = {"targeted": len(targets), "injected": len(injected), "exact": injected == targets,
                             "missing": sorted(set(targets) - set(injected))[:10],
                             "unexpected": sorted(set(injected) - set(targets))[:10], "names": injected}
            start = time.time()
            path = exp.export_lora(tmp / "lora")
            files = [p for p in Path(path).rglob("*") if p.is_file()] if Path(path).is_dir() else [Path(path)]
            entry["export_lora"] = {"seconds": round(time.time() - start, 2),
                                    "bytes": sum(p.stat().st_size for p in files)}
        result["fits"][which] = entry
        del exp, fit_batch, trainable
        release()
        lap(f"fit {fit_steps} step{'s' * (fit_steps > 1)}: {which}")
    result["gradient_checkpointing"] = ("the denoiser's own and the adapter's" if has_checkpointing else
                                        "the adapter's only (this denoiser has none of its own)")
    result["total_s"] = round(sum(times.values()), 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def child_or_traceback(name: str, out: Path) -> int:
    """One model of the quick mode's shared process: a failure is printed and the next model still runs."""
    import traceback

    try:
        return child(name, True, out)
    except Exception:
        traceback.print_exc()
        return 1


# -- the table ---------------------------------------------------------------------------------
def table(results: list[dict]) -> str:
    rows = []
    for r in results:
        fits = r.get("fits", {})
        lora = fits.get("lora", {}).get("lora", {})
        fit_ratios = ", ".join(f"{k} {v['ratio']:.2f}" for k, v in fits.items())
        exact = r.get("bit_exact", {})
        rows.append([
            r["model"], f"{r['parameters'] / 1e9:.2f} B", f"{r['weights'] / GIB:.2f} GiB",
            f"{r['load_ratio']:.3f}", fit_ratios,
            f"{lora.get('injected')} / {lora.get('targeted')} {'exact' if lora.get('exact') else 'DIFFER'}",
            "yes" if exact and all(exact.values()) else "NO", f"{r['denoise']['ratio']:.3f}", f"{r['total_s']:.0f} s"])
    head = ["model", "params", "weights", "load peak / weights", "fit peak / estimate",
            "LoRA injected / targeted", "bit-exact", "denoise wb / hand", "time"]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    line = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(head), "-+-".join("-" * w for w in widths), *map(line, rows)])


def markdown(results: list[dict]) -> str:
    """The results as the markdown tables of ``docs/results/real-size.md``."""
    g = lambda n: f"{n / GIB:.2f}"  # noqa: E731
    lines = ["| | " + " | ".join(r["model"] for r in results) + " |", "|---" * (len(results) + 1) + "|"]

    def row(label, fn):
        lines.append(f"| {label} | " + " | ".join(fn(r) for r in results) + " |")

    row("parameters (all built parts)", lambda r: f"{r['parameters'] / 1e9:.2f} B")
    row("size run", lambda r: r["size"])
    row("weights, GiB (dtypes)", lambda r: f"{g(r['weights'])} ({', '.join(r['weight_dtypes'])})")
    row("peak RSS loading, GiB", lambda r: g(r["load_peak"]))
    row("**peak loading / weights** (≤ 1.15)", lambda r: f"**{r['load_ratio']:.3f}**")
    for name in ADAPTERS:
        row(f"fit `{name}`: peak / estimate, GiB", lambda r, n=name: (
            f"{g(r['fits'][n]['peak'])} / {g(r['fits'][n]['estimate'])} = **{r['fits'][n]['ratio']:.2f}**"))
    for name in ADAPTERS:
        row(f"fit `{name}`: growth / (state + activations), GiB", lambda r, n=name: (
            f"{g(r['fits'][n]['peak'] - r['fits'][n]['rss_before'])} / "
            f"{g(r['fits'][n]['trainable_state'] + r['fits'][n]['activations'])}"))
    row("gradient checkpointing", lambda r: r["gradient_checkpointing"])
    row("**LoRA layers injected / targeted**", lambda r: (
        f"**{r['fits']['lora']['lora']['injected']} / {r['fits']['lora']['lora']['targeted']}, "
        f"{'exact' if r['fits']['lora']['lora']['exact'] else 'DIFFER'}**"))
    for key in ("recorded == unrecorded", "fork prefix == recorded prefix", "fork final == recorded final"):
        row(f"**{key}**", lambda r, k=key: "**bit-exact**" if r["bit_exact"][k] else "**differs**")
    row("ablation move: RMS change of x0 (recompose calls)", lambda r: (
        f"{r['ablation']['rms_change']:.3f} ({r['ablation']['recompose_calls']})"))
    row("tiny preview: held-out PSNR vs the VAE (2 clips)", lambda r: f"{r['tiny_preview']['psnr_db']:.1f} dB")
    row("export_lora", lambda r: f"{r['fits']['lora']['export_lora']['bytes'] / 2**20:.1f} MiB")
    row("**denoise: workbench / by hand** (≤ 1.02)", lambda r: (
        f"**{r['denoise']['ratio']:.3f}** ({r['denoise']['workbench_s']:.2f} s / {r['denoise']['by_hand_s']:.2f} s)"))
    row("wall time, s", lambda r: f"{r['total_s']:.0f}")
    phases = list(dict.fromkeys(k for r in results for k in r["times_s"]))
    lines += ["", "| phase (s) | " + " | ".join(r["model"] for r in results) + " |",
              "|---" * (len(results) + 1) + "|"]
    lines += [f"| {p} | " + " | ".join(str(r["times_s"].get(p, "")) for r in results) + " |" for p in phases]
    return "\n".join(lines)


def verdicts(r: dict) -> list[tuple[str, bool]]:
    """Each goal of one model's results, and whether it held."""
    fits = r["fits"]
    lora = fits["lora"]["lora"]
    return [(f"peak loading / weights = {r['load_ratio']:.3f} (<= 1.15)", r["load_ratio"] <= 1.15),
            *[(f"fit {k}: peak / estimate = {v['ratio']:.2f} (within 0.75-1.25)", 0.75 <= v["ratio"] <= 1.25)
              for k, v in fits.items()],
            (f"LoRA layers injected / targeted = {lora['injected']} / {lora['targeted']} (exact)", lora["exact"]),
            *[(f"{k} (bit-exact)", v) for k, v in r["bit_exact"].items()],
            (f"denoise workbench / by hand = {r['denoise']['ratio']:.3f} (<= 1.02)", r["denoise"]["ratio"] <= 1.02)]


def peaks(r: dict) -> str:
    return ", ".join(f"{k} {v['peak'] / GIB:.2f} GiB" for k, v in r["fits"].items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--quick", action="store_true", help="the tiny configurations (seconds; nothing judged)")
    parser.add_argument("--results", help="where the JSON files go (default benchmarks/real_size/results; "
                                          "--quick: a temporary directory)")
    parser.add_argument("--wait", type=int, default=1800, help="seconds to wait for free memory before a model")
    parser.add_argument("--markdown", action="store_true", help="print the stored results as markdown tables")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child and args.quick:  # --out: the folder each model's JSON goes to
        return max(child_or_traceback(name, Path(args.out) / f"{name}.json") for name in args.child.split(","))
    if args.child:
        return child(args.child, args.quick, Path(args.out))
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.markdown:
        folder = Path(args.results) if args.results else RESULTS
        print(markdown([json.loads((folder / f"{m}.json").read_text()) for m in names
                        if (folder / f"{m}.json").is_file()]))
        return 0
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    folder = Path(args.results) if args.results else (Path(tempfile.mkdtemp(prefix="real-size-")) if args.quick
                                                      else RESULTS)
    need = {"dynamicrafter": 8 * GIB, "wan22": 15 * GIB, "easyanimate": 16 * GIB}
    results, failed = [], []
    if args.quick:  # the tiny configurations, nothing judged: one process for all (one interpreter start and import)
        start = time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", ",".join(names), "--out", str(folder),
               "--quick"]
        status_code = subprocess.call(cmd)
        print(f"{', '.join(names)}: {time.time() - start:.0f} s in all in one process, exit {status_code}", flush=True)
    for name in names if args.quick else ():
        out = folder / f"{name}.json"
        done = out.is_file() and status_code == 0
        print(f"== {name}" + (f": {json.loads(out.read_text())['total_s']:.0f} s" if done else ": failed"), flush=True)
        if not done:
            failed.append(name)
            continue
        results.append(json.loads(out.read_text()))
    for name in () if args.quick else names:
        waited = 0
        while available() < need[name] and waited < args.wait:
            print(f"{name}: {available() / GIB:.1f} GiB available, {need[name] / GIB:.0f} GiB wanted; waiting",
                  flush=True)
            time.sleep(60)
            waited += 60
        out = folder / f"{name}.json"
        print(f"== {name}", flush=True)
        start = time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out)]
        status_code = subprocess.call(cmd)
        print(f"{name}: {time.time() - start:.0f} s in all, exit {status_code}", flush=True)
        if status_code != 0 or not out.is_file():
            failed.append(name)
            continue
        results.append(json.loads(out.read_text()))
    if results:
        print(table(results))
    for r in results:
        lora = r["fits"]["lora"]["lora"]
        print(f"{r['model']}: LoRA on {lora['injected']} layers, e.g. {', '.join(lora['names'][:3])}; "
              f"fit peaks {peaks(r)}; "
              f"load peak {r['load_peak'] / GIB:.2f} GiB for {r['weights'] / GIB:.2f} GiB of weights")
    missed = []
    for r in results:
        for text, held in verdicts(r):
            print(f"{r['model']}: {text}  {'ok' if held or args.quick else 'SHORT of its goal'}")
            if not held and not args.quick:
                missed.append(f"{r['model']}: {text}")
    if failed or missed:
        print(f"real_size: failed: {', '.join(failed) or '-'}; goals missed: {len(missed)}")
        return 1
    print(f"real_size: results in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
