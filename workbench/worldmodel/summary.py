"""The demo's first table: what the adapter buys, beside what it is measured against.

One column per model — the frozen base alone, base + adapter with the clip's own actions, the same
adapter given another episode's actions, the from-scratch model at the adapter's budget and the
measured-path ceiling (an adapter given the recorded hand of every frame: the future) — and one row
per question a newcomer asks: are the pictures better, does the arm go where the actions say, does
it hold on tasks never seen, does it hold over a whole episode (rollouts), and does it rank policies
as the simulator does, replaying their recorded actions (open loop) and letting them act on what the model
shows them (closed loop). Internal targets are not in it; the results pages discuss them.

Examples:
    >>> import json
    >>> from workbench.worldmodel.demo import TRAINED_ADAPTER
    >>> from workbench.worldmodel.summary import first_table
    >>> shipped = json.loads((TRAINED_ADAPTER / "demo_metrics.json").read_text())
    >>> first_table(shipped).splitlines()[2].split()
    ['moving-pixel', 'PSNR,', 'dB', '13.09', '14.76', '(+1.68)', '12.48']
"""

from __future__ import annotations

import math
from typing import Any

COLUMNS = ("frozen base", "base + adapter", "adapter, swapped", "from scratch", "measured path")
_WIDTH = 40


def _row(name: str, cells: list[str]) -> str:
    return f"{name:{_WIDTH}}" + "".join(f"{c:>20}" for c in cells)


def _clip_rows(metrics: dict[str, Any], scratch: dict[str, Any] | None,
               ceiling: dict[str, Any] | None) -> list[str]:
    s = metrics["summary"]
    m = s["mean"]
    gain = s["adapter_minus_base_moving_psnr_db"]
    sc = scratch["summary"] if scratch else None
    ce = ceiling["summary"] if ceiling else None
    psnr = [f"{m['base']['moving_psnr']:.2f}", f"{m['adapter']['moving_psnr']:.2f} ({gain:+.2f})",
            f"{m['swapped']['moving_psnr']:.2f}",
            f"{sc['mean']['adapter']['moving_psnr']:.2f} ({sc['adapter_minus_base_moving_psnr_db']:+.2f})"
            if sc else "",
            f"({ce['adapter_minus_base_moving_psnr_db']:+.2f})" if ce else ""]
    hand = [f"{m['base']['action_error']:.2f}",
            f"{m['adapter']['action_error']:.2f} ({s['action_error_adapter_over_base']:.2f}x)",
            f"{m['swapped']['action_error']:.2f}",
            f"{sc['mean']['adapter']['action_error']:.2f} ({sc['action_error_adapter_over_base']:.2f}x)"
            if sc else "",
            f"{ce['mean']['adapter']['action_error']:.2f} ({ce['action_error_adapter_over_base']:.2f}x)"
            if ce else ""]
    wins = ["", f"{100 * s['adapter_beats_swapped_fraction']:.0f}%", "",
            f"{100 * sc['adapter_beats_swapped_fraction']:.0f}%" if sc else "", ""]
    rows = [_row("moving-pixel PSNR, dB", psnr), _row("hand error (probe), cm", hand),
            _row("beats its swapped actions", wins)]
    unseen = metrics.get("unseen", {}).get("summary")
    if unseen:
        su = (scratch or {}).get("unseen", {}).get("summary")
        cu = (ceiling or {}).get("unseen", {}).get("summary")
        rows.append(_row("unseen tasks: gain, beats swapped", [
            "", f"{unseen['adapter_minus_base_moving_psnr_db']:+.2f} dB, "
                f"{100 * unseen['adapter_beats_swapped_fraction']:.0f}%", "",
            f"{su['adapter_minus_base_moving_psnr_db']:+.2f} dB, "
            f"{100 * su['adapter_beats_swapped_fraction']:.0f}%"
            if su else "", f"{cu['adapter_minus_base_moving_psnr_db']:+.2f} dB" if cu else ""]))
    return rows


def _rollout_row(rollout: dict[str, Any]) -> list[str]:
    rows = rollout["chunks"]
    cells = []
    for v in ("base", "adapter", "swapped", "scratch"):
        key = f"{v}_hand_error_cm"
        cells.append(f"{rows[0][key]:.1f} -> {rows[-1][key]:.1f}" if key in rows[0] else "")
    cells.append("")
    return [_row(f"rollout, hand error cm, chunk 1 -> {len(rows)}", cells)]


def _policy_row(name: str, policies: dict[str, Any]) -> list[str]:
    variants = policies["variants"]

    def rho(variant: str) -> str:
        a = variants.get(variant, {}).get("agreement")
        if a is None:
            return ""
        a = a["all"]
        if a["rho"] is None or not math.isfinite(a["rho"]):  # every policy imagined alike (read back: None)
            return "n/a (ties)"
        return f"{a['rho']:+.2f} [{a['low']:+.2f},{a['high']:+.2f}]"

    return [_row(f"policy ranking, {name}, rho [95%]", [rho("base"), rho("adapter"), "", rho("scratch"), ""])]


def first_table(metrics: dict[str, Any], *, scratch: dict[str, Any] | None = None,
                ceiling: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None,
                policies: dict[str, Any] | None = None, closed_loop: dict[str, Any] | None = None,
                notes: list[str] | None = None) -> str:
    """The first table of the demo and the README. Missing parts leave their cells blank (and their rows
    out).

    Args:
        metrics: A demo run's metrics (held-out clips, and ``unseen`` when it ran).
        scratch: The from-scratch run's metrics.
        ceiling: The measured-path run's metrics.
        rollout: :func:`~workbench.worldmodel.rollout_eval.summarise_rollouts`'s summary.
        policies: :func:`~workbench.worldmodel.policies.evaluate_policies`' report (open loop).
        closed_loop: :func:`~workbench.worldmodel.closed_loop_eval.evaluate_closed_loop`'s report.
        notes: Lines printed under the table (e.g. which columns are stored runs).

    Returns:
        The table as text, one line per row, with a title line first.
    """
    s = metrics["summary"]
    clips = s.get("clips", metrics.get("evaluation", {}).get("clips", "?"))
    lines = [f"What the adapter buys: {clips} held-out clips of the training tasks, "
             f"predicted from their first frame",
             _row("", list(COLUMNS))]
    lines += _clip_rows(metrics, scratch, ceiling)
    if rollout is not None:
        lines += _rollout_row(rollout)
    if policies is not None:
        lines += _policy_row("open loop", policies)
    if closed_loop is not None:
        lines += _policy_row("closed loop", closed_loop)
    floor = s.get("probe_error_on_truth_cm")
    if floor is not None:
        lines.append(f"the probe is {floor:.2f} cm off on the recorded frames (the hand error's floor); "
                     f"higher PSNR, lower error and rho near +1 are better")
    lines += notes or []
    return "\n".join(lines)


__all__ = ["COLUMNS", "first_table"]
