"""The demo's first table: its cells are the metrics' numbers, its blanks are what was not measured."""

import json

from workbench.worldmodel.demo import SCRATCH_REFERENCE, TRAINED_ADAPTER
from workbench.worldmodel.summary import COLUMNS, first_table

SHIPPED = json.loads((TRAINED_ADAPTER / "demo_metrics.json").read_text())


def cells(line: str) -> list[str]:
    """A table row's cells: the name (40 characters), then one cell per 20 characters."""
    return [line[:40].strip()] + [line[40 + 20 * i:60 + 20 * i].strip() for i in range(len(COLUMNS))]


def test_the_first_table_sets_the_adapter_beside_base_swapped_scratch_and_the_ceiling():
    ceiling = json.loads((TRAINED_ADAPTER / "measured_path_metrics.json").read_text())
    table = first_table(SHIPPED, scratch=json.loads(SCRATCH_REFERENCE.read_text()), ceiling=ceiling).splitlines()
    assert table[0].startswith("What the adapter buys: 36 held-out clips")
    assert cells(table[1])[1:] == list(COLUMNS)
    assert cells(table[2]) == ["moving-pixel PSNR, dB", "13.09", "14.76 (+1.68)", "12.48", "13.30 (+0.21)", "(+2.91)"]
    assert cells(table[3]) == ["hand error (probe), cm", "9.79", "5.76 (0.59x)", "11.55", "7.08 (0.72x)",
                               "3.80 (0.39x)"]
    assert cells(table[4]) == ["beats its swapped actions", "", "97%", "", "89%", ""]
    assert cells(table[5]) == ["unseen tasks: gain, beats swapped", "", "+1.98 dB, 100%", "", "+0.67 dB, 92%",
                               "+3.49 dB"]
    assert "NOT met" not in "\n".join(table) and "target" not in "\n".join(table)


def test_rollout_and_policy_rows_read_their_summaries_and_leave_unmeasured_cells_blank():
    rollout = {"chunks": [{"base_hand_error_cm": 8.88, "adapter_hand_error_cm": 6.44, "swapped_hand_error_cm": 12.6},
                          {"base_hand_error_cm": 19.37, "adapter_hand_error_cm": 9.79, "swapped_hand_error_cm": 20.7}]}
    agree = {"base": (0.31, -0.1, 0.6), "adapter": (0.83, 0.7, 0.9)}
    policies = {"variants": {k: {"agreement": {"all": {"rho": r, "low": lo, "high": hi}}}
                             for k, (r, lo, hi) in agree.items()}}
    table = first_table(SHIPPED, rollout=rollout, policies=policies).splitlines()
    row = next(line for line in table if line.startswith("rollout"))
    assert cells(row) == ["rollout, hand error cm, chunk 1 -> 2", "8.9 -> 19.4", "6.4 -> 9.8", "12.6 -> 20.7", "", ""]
    row = next(line for line in table if line.startswith("policy ranking"))
    assert cells(row) == ["policy ranking, Spearman rho [95%]", "+0.31 [-0.10,+0.60]", "+0.83 [+0.70,+0.90]",
                          "", "", ""]
    # without a scratch run or the ceiling their cells stay blank
    assert cells(table[2])[4:] == ["", ""]
