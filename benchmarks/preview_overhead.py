"""Live preview cost: recording with the x0 preview rendered at every step vs without (target <= 1.05)."""

from __future__ import annotations

import sys

from _bench import STEPS, finish, interleaved, judge, median, ratio, setup, start

from workbench.inspect import fit_preview, record, render


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    model, batch = setup()
    preview = fit_preview(model.base, latent_shape=tuple(batch.latents.shape[1:]))  # once; cached on disk
    frames = []

    def show(step):
        frames.append(render(model.base, step.x0, preview=preview))  # what a live view draws

    t = interleaved({
        "record": lambda: record(model, batch, steps=STEPS, seed=0),
        "record+preview": lambda: record(model, batch, steps=STEPS, seed=0, on_step=show),
    }, repeats=21)
    print(f"preview fit: {preview!r}")
    print(f"record {median(t['record']) * 1e3:.1f} ms, with a preview per step {median(t['record+preview']) * 1e3:.1f} "
          f"ms (CPU time)")
    judge("preview every step / no preview", ratio(t, "record+preview", "record"), 1.05)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
