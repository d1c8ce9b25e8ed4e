"""Condition ablation at one step: re-compose with the cached base output (adapter + composer only)
vs recomputing base and adapter, each followed by the x0 preview a slider view shows. Reports the speed-up."""

from __future__ import annotations

import sys

import torch
from _bench import STEPS, finish, interleaved, median, ratio, setup, start

from workbench.inspect import fit_preview, record, render


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    model, batch = setup()
    traj = record(model, batch, steps=STEPS, seed=0)
    preview = fit_preview(model.base, latent_shape=tuple(batch.latents.shape[1:]))
    k = STEPS // 2
    pushed = {"action": torch.full_like(batch.cond["action"], 0.9)}
    moved = {**batch.cond, **pushed}
    step = traj[k]

    def cached():
        pred = traj.recompose(k, cond=pushed)
        return render(model.base, traj.x0_of(pred), preview=preview)

    def recomputed():
        with torch.no_grad():
            new = type(batch)(latents=batch.latents, cond=moved, loss_mask=batch.loss_mask,
                              per_frame=batch.per_frame, meta=batch.meta)
            pred = model.predict(step.x_t, step.t, new)
        return render(model.base, traj.x0_of(pred), preview=preview)

    t = interleaved({"cached base": cached, "full recompute": recomputed}, repeats=41)
    print(f"re-render with cached base {median(t['cached base']) * 1e3:.2f} ms, full recompute "
          f"{median(t['full recompute']) * 1e3:.2f} ms (CPU time)")
    print(f"speed-up from the base cache = {ratio(t, 'full recompute', 'cached base'):.2f}x")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
