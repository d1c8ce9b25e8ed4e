"""Which network calls of a rollout give a sample other values when the batch around it changes?

    OMP_NUM_THREADS=1 python research/batch_ops.py

For each network a rollout or ``imagine()`` calls (the denoiser, the adapter, the autoencoder's encoder and
decoder, the hand probe) and for the single ops inside them (Conv2d, Conv3d, GroupNorm, Linear), the
same sample is evaluated in batches of several sizes and positions; the table says whether its output is
bit-identical to the one it gets alone (batch 1) and to the one it gets at position 0 of a batch of 24,
and the largest difference. Also: whether a sample's initial noise depends on the batch it is drawn in.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402


def compare(name: str, fn, make, sizes=(1, 2, 4, 5, 8, 16, 24), report=print) -> list[list[str]]:
    """``fn`` on batches of ``sizes`` whose sample at position ``pos`` (first and last) is the same input,
    the rest random; the layouts (``B@pos``) are grouped by bit-identical output of that sample."""
    torch.manual_seed(0)
    big = make(max(sizes))
    outs = {}
    for b in sizes:
        for pos in sorted({0, b - 1}):
            x = make(b)
            x[pos] = big[0]
            outs[f"{b}@{pos}"] = fn(x)[pos]
    groups: list[list[str]] = []
    for key, out in outs.items():
        for g in groups:
            if torch.equal(outs[g[0]], out):
                g.append(key)
                break
        else:
            groups.append([key])
    first = outs[groups[0][0]]
    spread = max((o - first).abs().max().item() for o in outs.values())
    report(f"{name:46} " + ("identical in every layout" if len(groups) == 1 else
                            f"{len(groups)} classes (max |diff| {spread:.1e}): "
                            + " | ".join(" ".join(g) for g in groups)))
    return groups


def main() -> None:
    torch.set_num_threads(1)
    from workbench.core.composers import scaled_gate
    from workbench.train import AdapterExperiment
    from workbench.worldmodel.demo import TRAINED_ADAPTER
    from workbench.worldmodel.probe import shipped_probe

    print(torch.__version__, torch.backends.cpu.get_cpu_capability(),
          "mkldnn" if torch.backends.mkldnn.is_available() else "no mkldnn")
    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    model = exp.model.eval()
    base = model.base
    den, ae = base.denoiser, base.autoencoder
    with torch.no_grad():
        print("-- single ops --")
        conv2 = nn.Conv2d(32, 64, 3, padding=1)
        compare("Conv2d 32->64 3x3 on 64x64", conv2, lambda b: torch.randn(b, 32, 64, 64))
        conv3 = nn.Conv3d(32, 32, (1, 3, 3), padding=(0, 1, 1))
        compare("Conv3d (1,3,3) on (32,16,16,16)", conv3, lambda b: torch.randn(b, 32, 16, 16, 16))
        convt = nn.Conv3d(32, 32, (3, 1, 1), padding=(1, 0, 0))
        compare("Conv3d (3,1,1) on (32,16,16,16)", convt, lambda b: torch.randn(b, 32, 16, 16, 16))
        gn = nn.GroupNorm(8, 32)
        compare("GroupNorm(8, 32) on (32,16,16,16)", gn, lambda b: torch.randn(b, 32, 16, 16, 16))
        lin = nn.Linear(64, 64)
        compare("Linear 64->64", lin, lambda b: torch.randn(b, 64))
        print("-- the networks --")
        c, t, h = 4, 16, 16
        lvl = 0.7

        def denoise(x):
            b = x.shape[0]
            return den(x[:, :c], torch.full((b,), lvl), x[:, c:, 0])

        compare("denoiser (B, 4, 16, 16, 16)", denoise, lambda b: torch.randn(b, 2 * c, t, h, h))
        compare("encoder, one frame per sample", ae.encoder, lambda b: torch.rand(b, 3, 64, 64) * 2 - 1)
        compare("decoder, one frame per sample", ae.decoder, lambda b: torch.randn(b, 4, 16, 16))
        compare("base.encode, 2 frames per sample (image path)",
                lambda v: base.encode(v), lambda b: torch.rand(b, 3, 2, 64, 64) * 2 - 1)
        compare("base.decode, 16 frames per sample", lambda z: base.decode(z),
                lambda b: torch.randn(b, 4, 16, 16, 16), sizes=(1, 2, 5, 8, 24))
        probe = shipped_probe()
        compare("hand probe network", probe,
                lambda b: torch.rand(b, 3, 64, 64) * 2 - 1)
        print("-- the composed prediction (base + adapter + composer, gate x2) --")
        from workbench.worldmodel.rollout_eval import long_episodes

        items = long_episodes("long", frames=16, episodes=12)
        raw = {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in ("video", "action", "ee_pos",
                                                                               "camera")}
        batch = base.prepare_batch(raw)
        gate = scaled_gate(model.composer, 2.0)

        def composed(idx_x):
            idx, x = idx_x
            sub = batch.select(idx)
            with model.composer.override_gate(gate):
                return model.compose_step(x, torch.full((x.shape[0],), lvl), sub)

        torch.manual_seed(0)
        x_all = torch.randn(batch.latents.shape)
        ref = composed((torch.tensor([0]), x_all[:1]))[0]
        for b in (2, 5, 12):
            idx = torch.arange(b)
            out = composed((idx, x_all[:b]))[0]
            print(f"  compose_step sample 0 in a batch of {b:2}: max |diff| vs alone = {(out - ref).abs().max():.2e}")
        print("-- initial noise --")
        shape = (4, 16, 16, 16)
        g = torch.Generator().manual_seed(5)
        n24 = torch.randn((24, *shape), generator=g)
        g = torch.Generator().manual_seed(5)
        n5 = torch.randn((5, *shape), generator=g)
        print(f"  randn(24)[i] == randn(5)[i] for i < 5: {torch.equal(n24[:5], n5)}; "
              f"so episode 7 gets slot 7 in a batch of 24 and slot 2 in the second batch of 5: "
              f"equal noise: {torch.equal(n24[7], n5[2])}")


if __name__ == "__main__":
    main()
