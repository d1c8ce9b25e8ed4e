"""Record / fork / recompose / preview on CUDA, with the parity claims asserted there, and the
conformance kit (``workbench.testing.check_backbone``) in bfloat16.

``--device cuda`` requires CUDA: without a visible device it fails (exit 2) saying so, never a
silent pass. The default ``--device auto`` uses CUDA when visible and otherwise says that it
runs the same checks on the CPU. Exits non-zero if a claim fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch
from _bench import BENCH_BASE, STEPS, setup

from workbench.inspect import StopSampling, StoragePolicy, fit_preview, record


class CountedDenoise:
    """Wraps ``base.denoise`` to count the base's calls."""

    def __init__(self, base):
        self.inner, self.calls = base.denoise, 0
        base.denoise = self

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)


def check(device: str, objective: str) -> None:
    model, batch = setup(device, objective)
    plain = model.generate(batch, steps=STEPS, generator=torch.Generator(device=device).manual_seed(3))
    traj = record(model, batch, steps=STEPS, seed=3)
    assert traj.final.device.type == "cpu" and traj[0].x_t.device.type == "cpu"
    if device == "cuda":
        assert traj[0].x_t.is_pinned(), "stored copies should land in pinned memory (non_blocking)"
    assert torch.equal(traj.final, plain.cpu()), "recorded != generate"
    on_device = record(model, batch, steps=STEPS, seed=3, storage=StoragePolicy(device=None))
    assert on_device.final.device == plain.device and torch.equal(on_device.final, plain)

    counter = CountedDenoise(model.base)
    pushed = {"action": torch.full_like(batch.cond["action"], 0.9)}
    fork = traj.fork(at=10, cond=pushed)
    assert counter.calls == STEPS - 10, "the fork's prefix made model calls"
    assert torch.equal(fork[10].x_t, traj[10].x_t), "the fork's prefix is not bit-identical"
    fresh = record(model, dataclasses.replace(batch, cond={**batch.cond, **pushed}), steps=STEPS, seed=3)
    assert torch.equal(traj.fork(at=0, cond=pushed).final, fresh.final), "fork at 0 != a fresh run"

    def stop(step):
        if step.index == 7:
            raise StopSampling

    resumed = record(model, batch, steps=STEPS, seed=3, on_step=stop).resume()
    assert torch.equal(resumed.final, traj.final), "resume != the uninterrupted run"
    counter.calls = 0
    pred = traj.recompose(10, cond=pushed)
    assert counter.calls == 0 and pred.composed.device == plain.device, "recompose ran the base"
    assert torch.equal(traj.recompose(10).composed.cpu(), traj[10].composed), "recompose != recorded"

    preview = fit_preview(model.base, latent_shape=tuple(batch.latents.shape[1:]), cache=False)
    assert preview.psnr > preview.baseline_psnr
    assert traj.frames(10).shape == traj.frames("final", decode="full").shape == (8, 32, 32, 3)
    start = time.perf_counter()
    record(model, batch, steps=STEPS, seed=3)
    print(f"{objective} on {device}: parity, fork prefix, fork at 0, resume, recompose and preview OK "
          f"(preview {preview.psnr:.1f} dB vs constant {preview.baseline_psnr:.1f} dB; a recorded "
          f"{STEPS}-step run took {time.perf_counter() - start:.3f} s)")


def conformance(device: str, dtype: torch.dtype) -> bool:
    """The backbone contract, every promise, on ``device`` in ``dtype``; prints the report."""
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
    from workbench.testing import check_backbone

    def make():
        torch.manual_seed(0)
        return TinyVideo(TinyVideoConfig(**BENCH_BASE))

    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(2, 3, 8, 32, 32, generator=g) * 2 - 1,
           **{k: torch.rand(2, 8, d, generator=g) for k, d in (("action", 4), ("proprio", 3), ("ee_pos", 3))}}
    report = check_backbone(make, raw=raw, adapter_factory=lambda: LatentResidual(width=32, depth=2), device=device,
                            dtype=dtype, raise_on_broken=False)
    print(report)
    return report.ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="auto", help="cuda (required), cpu, or auto (cuda when visible)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="precision of the conformance run (auto: bfloat16 on cuda, float32 on cpu)")
    args = parser.parse_args(argv)
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
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        args.dtype, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    for objective in ("flow_matching", "diffusion"):
        check(device, objective)
    return 0 if conformance(device, dtype) else 1


if __name__ == "__main__":
    sys.exit(main())
