"""The demo's first table: its cells are the metrics' numbers, its blanks are what was not measured."""

import json

import numpy as np

from workbench.worldmodel.demo import SCRATCH_REFERENCE, TRAINED_ADAPTER
from workbench.worldmodel.summary import COLUMNS, first_table

SHIPPED = json.loads((TRAINED_ADAPTER / "demo_metrics.json").read_text())
SCRATCH = json.loads(SCRATCH_REFERENCE.read_text())


def averaged(per_clip: dict) -> dict[str, str]:
    """A run's cells computed here from its stored per-clip scores, not from the summary the table reads: the
    mean moving PSNR and hand error of each variant, the adapter's gain over the base and its hand error over
    the base's, and the share of clips whose adapter beats its swapped actions on moving PSNR."""
    mean = {k: float(np.mean(v)) for k, v in per_clip.items() if k.split("_")[0] in ("base", "adapter", "swapped")}
    gain = mean["adapter_moving_psnr"] - mean["base_moving_psnr"]
    ratio = mean["adapter_action_error"] / mean["base_action_error"]
    wins = 100 * np.mean(np.asarray(per_clip["adapter_moving_psnr"]) > np.asarray(per_clip["swapped_moving_psnr"]))
    shown = {f"{v} {m}": f"{mean[f'{v}_{m}']:.2f}"
             for v in ("base", "swapped") for m in ("moving_psnr", "action_error")}
    return {**shown, "psnr": f"{mean['adapter_moving_psnr']:.2f} ({gain:+.2f})",
            "hand": f"{mean['adapter_action_error']:.2f} ({ratio:.2f}x)", "wins": f"{wins:.0f}%",
            "unseen": f"{gain:+.2f} dB, {wins:.0f}%"}


def cells(line: str) -> list[str]:
    """A table row's cells: the name (40 characters), then one cell per 20 characters."""
    return [line[:40].strip()] + [line[40 + 20 * i:60 + 20 * i].strip() for i in range(len(COLUMNS))]


def test_the_first_table_sets_the_adapter_beside_base_swapped_scratch_and_the_ceiling():
    ceiling = json.loads((TRAINED_ADAPTER / "measured_path_metrics.json").read_text())
    table = first_table(SHIPPED, scratch=SCRATCH, ceiling=ceiling).splitlines()
    assert table[0].startswith("What the adapter buys: 36 held-out clips")
    assert cells(table[1])[1:] == list(COLUMNS)
    # the shipped runs' numbers (`workbench demo` with its defaults, and with --from-scratch), as the README shows
    assert cells(table[2]) == ["moving-pixel PSNR, dB", "13.09", "14.76 (+1.68)", "12.48", "13.30 (+0.21)", "(+2.91)"]
    assert cells(table[3]) == ["hand error (probe), cm", "9.79", "5.76 (0.59x)", "11.55", "7.08 (0.72x)",
                               "3.80 (0.39x)"]
    assert cells(table[4]) == ["beats its swapped actions", "", "97%", "", "89%", ""]
    assert cells(table[5]) == ["unseen tasks: gain, beats swapped", "", "+1.98 dB, 100%", "", "+0.67 dB, 92%",
                               "+3.49 dB"]
    assert "NOT met" not in "\n".join(table) and "target" not in "\n".join(table)
    # the same cells from the 36 clips' own scores, averaged here (the measured path stores its summary only)
    a, s = averaged(SHIPPED["per_clip"]), averaged(SCRATCH["per_clip"])
    assert len(SHIPPED["per_clip"]["adapter_moving_psnr"]) == len(SCRATCH["per_clip"]["base_psnr"]) == 36
    assert cells(table[2])[1:5] == [a["base moving_psnr"], a["psnr"], a["swapped moving_psnr"], s["psnr"]]
    assert cells(table[3])[1:5] == [a["base action_error"], a["hand"], a["swapped action_error"], s["hand"]]
    assert cells(table[4])[1:5] == ["", a["wins"], "", s["wins"]]
    unseen = [averaged(run["unseen"]["per_clip"])["unseen"] for run in (SHIPPED, SCRATCH)]
    assert cells(table[5])[1:5] == ["", unseen[0], "", unseen[1]]


def test_rollout_and_policy_rows_read_their_summaries_and_leave_unmeasured_cells_blank():
    rollout = {"chunks": [{"base_hand_error_cm": 8.88, "adapter_hand_error_cm": 6.44, "swapped_hand_error_cm": 12.6},
                          {"base_hand_error_cm": 19.37, "adapter_hand_error_cm": 9.79, "swapped_hand_error_cm": 20.7}]}
    agree = {"base": (0.31, -0.1, 0.6), "adapter": (0.83, 0.7, 0.9)}
    policies = {"variants": {k: {"agreement": {"all": {"rho": r, "low": lo, "high": hi}}}
                             for k, (r, lo, hi) in agree.items()}}
    # closed loop: a base that imagines every policy alike has no ranking (NaN), the ceiling is not a column
    closed = {"variants": {"probe_on_sim": {"agreement": {"all": {"rho": 0.99, "low": 0.95, "high": 1.0}}},
                           "base": {"agreement": {"all": {"rho": float("nan"), "low": float("nan"),
                                                          "high": float("nan")}}},
                           "adapter": {"agreement": {"all": {"rho": 0.714, "low": -0.2, "high": 0.886}}}}}
    table = first_table(SHIPPED, rollout=rollout, policies=policies, closed_loop=closed).splitlines()
    row = next(line for line in table if line.startswith("rollout"))
    assert cells(row) == ["rollout, hand error cm, chunk 1 -> 2", "8.9 -> 19.4", "6.4 -> 9.8", "12.6 -> 20.7", "", ""]
    row = next(line for line in table if line.startswith("policy ranking, open"))
    assert cells(row) == ["policy ranking, open loop, rho [95%]", "+0.31 [-0.10,+0.60]", "+0.83 [+0.70,+0.90]",
                          "", "", ""]
    assert table[table.index(row) + 1] == next(line for line in table if line.startswith("policy ranking, closed"))
    assert cells(table[table.index(row) + 1]) == ["policy ranking, closed loop, rho [95%]", "n/a (ties)",
                                                  "+0.71 [-0.20,+0.89]", "", "", ""]
    # without a scratch run or the ceiling their cells stay blank
    assert cells(table[2])[4:] == ["", ""]
