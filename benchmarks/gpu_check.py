"""Record / fork / recompose / preview on CUDA, with the parity claims asserted there, and the
conformance kit (``workbench.testing.check_backbone``) on every installed backbone in the
precision its card runs on a GPU.

``--device cuda`` requires CUDA: without a visible device it fails (exit 2) saying so, never a
silent pass. The default ``--device auto`` uses CUDA when visible and otherwise says that it
runs the same checks on the CPU. The conformance runs on ``tiny_video`` and on each installed
plugin's tiny model (``wan22_ti2v``, ``easyanimate``, ``dynamicrafter``; ``--backbones`` picks),
in ``--dtype`` (``auto``: bfloat16 on CUDA, float32 on the CPU; ``gpu`` the card's GPU precision
on any device — bf16 on the CPU is how the GPU default is exercised without one). Exits
non-zero if a claim fails. ``--quick``: fewer sampling steps and smaller clips, the same checks (seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import tempfile
import time

import torch
from _bench import BENCH_BASE, setup

from workbench.inspect import StopSampling, StoragePolicy, fit_preview, record

BACKBONES = ("tiny_video", "wan22_ti2v", "easyanimate", "dynamicrafter")
PLUGIN_MODULES = {"wan22_ti2v": "workbench_wan22", "easyanimate": "workbench_easyanimate",
                  "dynamicrafter": "workbench_dynamicrafter"}


class CountedDenoise:
    """Wraps ``base.denoise`` to count the base's calls."""

    def __init__(self, base):
        self.inner, self.calls = base.denoise, 0
        base.denoise = self

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)


def check(device: str, objective: str, steps: int) -> None:
    model, batch = setup(device, objective)
    fork_at, stop_at = steps // 2, max(1, steps // 3)
    plain = model.generate(batch, steps=steps, generator=torch.Generator(device=device).manual_seed(3))
    traj = record(model, batch, steps=steps, seed=3)
    assert traj.final.device.type == "cpu" and traj[0].x_t.device.type == "cpu"
    if device == "cuda":
        assert traj[0].x_t.is_pinned(), "stored copies should land in pinned memory (non_blocking)"
    assert torch.equal(traj.final, plain.cpu()), "recorded != generate"
    on_device = record(model, batch, steps=steps, seed=3, storage=StoragePolicy(device=None))
    assert on_device.final.device == plain.device and torch.equal(on_device.final, plain)

    counter = CountedDenoise(model.base)
    pushed = {"action": torch.full_like(batch.cond["action"], 0.9)}
    fork = traj.fork(at=fork_at, cond=pushed)
    assert counter.calls == steps - fork_at, "the fork's prefix made model calls"
    assert torch.equal(fork[fork_at].x_t, traj[fork_at].x_t), "the fork's prefix is not bit-identical"
    fresh = record(model, dataclasses.replace(batch, cond={**batch.cond, **pushed}), steps=steps, seed=3)
    assert torch.equal(traj.fork(at=0, cond=pushed).final, fresh.final), "fork at 0 != a fresh run"

    def stop(step):
        if step.index == stop_at:
            raise StopSampling

    resumed = record(model, batch, steps=steps, seed=3, on_step=stop).resume()
    assert torch.equal(resumed.final, traj.final), "resume != the uninterrupted run"
    counter.calls = 0
    pred = traj.recompose(fork_at, cond=pushed)
    assert counter.calls == 0 and pred.composed.device == plain.device, "recompose ran the base"
    assert torch.equal(traj.recompose(fork_at).composed.cpu(), traj[fork_at].composed), "recompose != recorded"

    preview = fit_preview(model.base, latent_shape=tuple(batch.latents.shape[1:]), cache=False)
    assert preview.psnr > preview.baseline_psnr
    assert traj.frames(fork_at).shape == traj.frames("final", decode="full").shape == (8, 32, 32, 3)
    started = time.perf_counter()
    record(model, batch, steps=steps, seed=3)
    print(f"{objective} on {device}: parity, fork prefix, fork at 0, resume, recompose and preview OK "
          f"(preview {preview.psnr:.1f} dB vs constant {preview.baseline_psnr:.1f} dB; a recorded "
          f"{steps}-step run took {time.perf_counter() - started:.3f} s)")


def subject(name: str, steps: int, quick: bool = False):
    """``(make_backbone, raw, adapter_factory)`` for ``name``'s tiny model; ``raw`` is the backbone's own
    ``example_batch()`` (every input it takes), so it cannot go stale (``quick``: smaller clips)."""
    from workbench.config import build

    if name == "tiny_video":
        from workbench.adapters.latent_residual import LatentResidual
        from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig

        def make():
            torch.manual_seed(0)
            return TinyVideo(TinyVideoConfig(**{**BENCH_BASE, "sampling_steps": steps}))

        return make, make().example_batch(), lambda: LatentResidual(width=32, depth=2)
    frames, size = ((4, 16) if quick else (4, 32)) if name == "dynamicrafter" else ((5, 32) if quick else (9, 64))
    config = {"path": "tiny", "prompt": "a robot arm pushes a puck", "steps": steps, "num_frames": frames,
              "height": size, "width": size}
    adapter, channels = {"wan22_ti2v": ("wan22_latent_residual", 48), "easyanimate": ("easyanimate_latent_residual", 4),
                         "dynamicrafter": ("dynamicrafter_latent_residual", 4)}[name]
    return (lambda: build("backbone", name, config), build("backbone", name, config).example_batch(),
            lambda: build("adapter", adapter, {"channels": channels, "width": 16, "depth": 1}))


def gpu_dtypes(card) -> list[torch.dtype]:
    """What the card runs on a GPU: its CUDA precision (bfloat16 / float16), each listed one."""
    choice = card.precision.get("cuda", "float32")
    names = (choice,) if isinstance(choice, str) else tuple(choice)
    return [getattr(torch, n) for n in names]


def conformance(device: str, dtype: str, backbones: list[str], steps: int, quick: bool = False) -> bool:
    """The backbone contract, every promise, on ``device`` for each backbone; prints the reports."""
    from workbench.testing import check_backbone

    ok = True
    for name in backbones:
        if name in PLUGIN_MODULES and importlib.util.find_spec(PLUGIN_MODULES[name]) is None:
            print(f"{name}: not installed (pip install -e plugins/...); skipped")
            continue
        make, raw, adapter = subject(name, steps, quick)
        if dtype == "gpu":
            dtypes = gpu_dtypes(make().card)
        elif dtype == "auto":
            dtypes = [torch.bfloat16 if device.startswith("cuda") else torch.float32]
        else:
            dtypes = [getattr(torch, dtype)]
        for d in dtypes:
            report = check_backbone(make, raw=raw, adapter_factory=adapter, device=device, dtype=d, steps=steps,
                                    raise_on_broken=False)
            print(report)
            ok &= report.ok
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="cuda (required), cpu, or auto (cuda when visible)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "gpu", "float32", "bfloat16", "float16"),
                        help="precision of the conformance runs (auto: bfloat16 on cuda, float32 on cpu; gpu: each "
                             "card's GPU precision on any device)")
    parser.add_argument("--backbones", default=",".join(BACKBONES),
                        help="comma-separated backbones to check (default: %(default)s; plugins when installed)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer sampling steps and smaller clips, the same checks (seconds)")
    args = parser.parse_args(argv)
    os.environ.setdefault("WORKBENCH_CACHE", tempfile.mkdtemp(prefix="workbench-gpu-check-"))  # the tiny models
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            print("gpu_check: no CUDA device is visible; running the same checks on the CPU "
                  "(pass --device cuda to require a GPU)")
    elif device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: FAILED: --device {device} was asked for, but no CUDA device is visible (torch "
              f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none: a CPU-only build'}). Run on a "
              f"machine with a GPU and a CUDA build of torch; --device cpu runs the same checks on the CPU.",
              file=sys.stderr)
        return 2
    unknown = [b for b in args.backbones.split(",") if b and b not in BACKBONES]
    if unknown:
        print(f"gpu_check: unknown backbone(s) {unknown}; choose from {', '.join(BACKBONES)}", file=sys.stderr)
        return 2
    steps = 4 if args.quick else 20
    for objective in ("flow_matching", "diffusion"):
        check(device, objective, steps)
    ok = conformance(device, args.dtype, [b for b in args.backbones.split(",") if b], 2 if args.quick else 10,
                     args.quick)
    print("gpu_check: every claim holds" if ok else "gpu_check: FAILED: a promise above is broken")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
