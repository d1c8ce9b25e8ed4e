"""Markdown tables of the ablation from the runs' JSON files (``outputs/r40/*/train.json``, ``eval*.json``;
copies of the measured runs' are kept in ``research/results``).

    python research/make_tables.py [NAME ...]

Per variant: training steps and CPU minutes, the hand error per chunk of the 144-frame rollouts (probe
state; and with the dead-reckoned and recorded state where measured), its largest ratio to the frozen
base's, the moving-pixel PSNR per chunk, and the single-window numbers where measured. The frozen base's
and the shipped adapter's rows come from ``outputs/r40/shipped``
(and ``research/out/baseline_rollout/rollout_metrics.json``, the ``workbench eval --rollout`` run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The runs' own output when they were just run here; else the records kept beside this script.
ROOT = Path("outputs/r40") if Path("outputs/r40").is_dir() else Path(__file__).resolve().parent / "results"
BASE = [8.81, 16.35, 15.85, 19.02, 19.18, 21.83, 23.15, 20.30, 17.07, 15.85]
BASE_PSNR = [12.55, 11.89, 12.11, 12.79, 12.36, 11.67, 11.84, 11.73, 12.48, 12.74]


def _load(name: str) -> tuple[dict, dict]:
    train = ROOT / name / "train.json"
    t = json.loads(train.read_text()) if train.exists() else {}
    e = {}
    for f in sorted((ROOT / name).glob("eval*.json")):
        level = f.stem.partition("_")[2]
        for k, v in json.loads(f.read_text()).items():
            e[k if not level else f"{k}@{level}"] = v
    return t, e


def _fmt(xs):
    return " | ".join(f"{x:.1f}" for x in xs)


def main(names: list[str]) -> None:
    names = names or sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "eval.json").exists())
    print("| variant | steps | train CPU min | " + " | ".join(f"c{k}" for k in range(10)) + " | max | max/base |")
    print("|---|---|---|" + "---|" * 12)
    print(f"| frozen base | – | – | {_fmt(BASE)} | {max(BASE):.1f} | 1.00 |")
    for key, label in (("rollout", "probe"), ("rollout_reckoned", "reckoned"), ("rollout_recorded", "recorded"),
                       ("teacher_forced", "teacher forced")):
        for name in names:
            t, e = _load(name)
            for level in ("", "@0.1"):
                hand = e.get(f"{key}_adapter_hand_cm{level}")
                if hand is None:
                    continue
                # (a rollout shorter than the 144 frames, `eval_variant.py --frames`, has its first chunks only)
                ratio = max(h / b for h, b in zip(hand, BASE[:len(hand)], strict=True))
                steps = t.get("steps", 600 if name == "shipped" else "?")
                cpu = f"{t['cpu_s'] / 60:.1f}" if "cpu_s" in t else "–"
                tag = f" ({label}{', level 0.1' if level else ''})"
                print(f"| {name}{tag} | {steps} | {cpu} | {_fmt(hand)} | {max(hand):.1f} | {ratio:.2f} |")
    print()
    print("Moving-pixel PSNR (dB) per chunk, probe state:\n")
    print("| variant | " + " | ".join(f"c{k}" for k in range(10)) + " |")
    print("|---|" + "---|" * 10)
    print(f"| frozen base | {_fmt(BASE_PSNR)} |")
    for name in names:
        _, e = _load(name)
        for level in ("", "@0.1"):
            p = e.get(f"rollout_adapter_moving_psnr{level}")
            if p is not None:
                print(f"| {name}{' (level 0.1)' if level else ''} | {_fmt(p)} |")
    print()
    print("| variant | gain dB | beats swapped | action error cm | unseen gain dB | unseen wins |")
    print("|---|---|---|---|---|---|")
    for name in names:
        _, e = _load(name)
        s, u = e.get("sample"), e.get("unseen")
        if s or u:
            print(f"| {name} | {s['gain_db']:+.2f} | {100 * s['beats_swapped']:.0f}% | {s['action_error_cm']:.2f} | "
                  f"{u['gain_db']:+.2f} | {100 * u['beats_swapped']:.0f}% |" if s and u else f"| {name} | {s} | {u} |")


if __name__ == "__main__":
    main(sys.argv[1:])
