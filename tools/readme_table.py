"""The README's first table and the numbers of the paragraph after it, written from the measured data.

Sources, each written by a command (none typed by hand):

* the shipped run's ``demo_metrics.json`` (``workbench demo``), the shipped from-scratch run's
  (``metaworld_scratch``, ``workbench demo --from-scratch``) and the measured-path run's stored beside the first
  (``measured_path_metrics.json``), as the demo reads them: the held-out and unseen rows;
* ``docs/results/data/rollouts.json``: the ``rollout_metrics.json`` of
  ``workbench eval workbench/worldmodel/weights/metaworld_action --rollout --steps 8 --gate-scale 2``
  (the 8-step run of [Rollouts](docs/results/rollouts.md));
* ``docs/results/data/policy_ranking.json``: the agreement of each variant from ``policy_ranking.json`` of
  the open-loop command on [Policy ranking](docs/results/policy-ranking.md);
* ``docs/results/data/closed_loop.json``: the ``metrics.json`` of the closed-loop command on the same page.

``python tools/readme_table.py`` prints the block; ``--write`` replaces it in README.md, between its two
markers. ``tests/test_project_files.py`` fails when the README's block differs from what this prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "workbench" / "worldmodel" / "weights" / "metaworld_action"
SCRATCH = ROOT / "workbench" / "worldmodel" / "weights" / "metaworld_scratch"
DATA = ROOT / "docs" / "results" / "data"
BEGIN = "<!-- the first table: written by tools/readme_table.py from the measured data; edit the data, not this -->"
END = "<!-- end of the first table -->"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _num(value: float, spec: str) -> str:
    """A number as the README prints it: a true minus sign."""
    return format(value, spec).replace("-", "−")


def _rho(agreement: dict) -> str:
    return f"{_num(agreement['rho'], '+.2f')} [{_num(agreement['low'], '+.2f')}, {_num(agreement['high'], '+.2f')}]"


def block() -> str:
    demo, ceiling = _load(RUN / "demo_metrics.json"), _load(RUN / "measured_path_metrics.json")
    scratch = _load(SCRATCH / "demo_metrics.json")
    rollout, policies = _load(DATA / "rollouts.json")["summary"], _load(DATA / "policy_ranking.json")
    closed = _load(DATA / "closed_loop.json")
    s, sc, ce = demo["summary"], scratch["summary"], ceiling["summary"]
    m, scm = s["mean"], sc["mean"]
    u, su, cu = demo["unseen"]["summary"], scratch["unseen"]["summary"], ceiling["unseen"]["summary"]
    chunks = rollout["chunks"]
    first, last = chunks[0], chunks[-1]

    def drift(variant: str) -> str:
        return f"{first[f'{variant}_hand_error_cm']:.1f} → {last[f'{variant}_hand_error_cm']:.1f}"

    ranks = {name: variant["agreement"] for name, variant in policies["variants"].items()}
    acted = {name: variant["agreement"] for name, variant in closed["variants"].items()}
    rows = [
        f"| {s['clips']} held-out clips of the training tasks, predicted from their first frame | frozen base | "
        "base + adapter | adapter, swapped actions | from scratch (same budget) | measured path (ceiling) |",
        "|---|---|---|---|---|---|",
        f"| moving-pixel PSNR, dB | {m['base']['moving_psnr']:.2f} | **{m['adapter']['moving_psnr']:.2f}** "
        f"({_num(s['adapter_minus_base_moving_psnr_db'], '+.2f')}) | {m['swapped']['moving_psnr']:.2f} | "
        f"{scm['adapter']['moving_psnr']:.2f} ({_num(sc['adapter_minus_base_moving_psnr_db'], '+.2f')}) | "
        f"({_num(ce['adapter_minus_base_moving_psnr_db'], '+.2f')}) |",
        f"| hand error (probe), cm | {m['base']['action_error']:.2f} | **{m['adapter']['action_error']:.2f}** "
        f"({s['action_error_adapter_over_base']:.2f}×) | {m['swapped']['action_error']:.2f} | "
        f"{scm['adapter']['action_error']:.2f} ({sc['action_error_adapter_over_base']:.2f}×) | "
        f"{ce['mean']['adapter']['action_error']:.2f} ({ce['action_error_adapter_over_base']:.2f}×) |",
        f"| beats its own swapped actions | | **{100 * s['adapter_beats_swapped_fraction']:.0f}%** | | "
        f"{100 * sc['adapter_beats_swapped_fraction']:.0f}% | |",
        f"| unseen tasks: gain, beats swapped | | **{_num(u['adapter_minus_base_moving_psnr_db'], '+.2f')} dB, "
        f"{100 * u['adapter_beats_swapped_fraction']:.0f}%** | | "
        f"{_num(su['adapter_minus_base_moving_psnr_db'], '+.2f')} dB, "
        f"{100 * su['adapter_beats_swapped_fraction']:.0f}% | "
        f"{_num(cu['adapter_minus_base_moving_psnr_db'], '+.2f')} dB |",
        f"| rollout, {rollout['episodes']} episodes of {rollout['frames']} frames: hand error cm, chunk 1 → "
        f"{len(chunks)} | {drift('base')} | **{drift('adapter')}** | {drift('swapped')} | | |",
        f"| ranking 6 policies on reach and push as the simulator does, their recorded actions replayed (open loop; "
        f"Spearman ρ, 95% interval) | {_rho(ranks['base']['all'])} | **{_rho(ranks['adapter']['all'])}** | | "
        f"{_rho(ranks['scratch']['all'])} | |",
        f"| the same, each chunk's actions chosen from the model's own last frame (closed loop, "
        f"{closed['start_states']['per_task']} fresh start states per task) | {_rho(acted['base']['all'])} | "
        f"**{_rho(acted['adapter']['all'])}** | | {_rho(acted['scratch']['all'])} | |",
    ]
    gap_first = first["base_hand_error_cm"] - first["adapter_hand_error_cm"]
    gap_last = last["base_hand_error_cm"] - last["adapter_hand_error_cm"]
    lead = "fades" if gap_last < gap_first else "grows"
    text = (
        "The adapter makes the frozen base follow the actions: sharper moving pixels, the hand "
        f"{s['action_error_adapter_over_base']:.2f}× as far\nfrom where the robot put it, and worse when it is given "
        "someone else's actions. The same network\ntrained from scratch at the same budget learns the actions but "
        "not the pictures; the *measured path*\n(an adapter given the recorded hand of every frame, the future) "
        "shows what a perfect path would buy.\nOver whole episodes, each chunk predicted from the last frame the "
        f"model made, the adapter's lead {lead}\n({first['adapter_hand_error_cm']:.1f} against "
        f"{first['base_hand_error_cm']:.1f} cm in the first chunk, {last['adapter_hand_error_cm']:.1f} against "
        f"{last['base_hand_error_cm']:.1f} in the last; [rollouts](docs/results/rollouts.md)).\nReplaying recorded "
        "actions in place of the simulator, it ranks the reach policies at ρ "
        f"{_num(ranks['adapter']['reach-v3']['rho'], '+.2f')} against the simulator's\norder and the push ones at ρ "
        f"{_num(ranks['adapter']['push-v3']['rho'], '+.2f')}; letting each policy choose its actions from the frames "
        "the model makes\n(closed loop), all pairs at ρ "
        f"{_num(acted['adapter']['all']['rho'], '+.2f')}, the frozen base at "
        f"{_num(acted['base']['all']['rho'], '+.2f')} ([policy ranking](docs/results/policy-ranking.md)). "
        f"The probe itself\nis {s['probe_error_on_truth_cm']:.2f} cm off on the recorded frames. The from-scratch "
        "and measured-path columns are stored runs\nand the last three rows the longer evaluations of their results "
        "pages; the rest is what the demo computes.")
    return "\n".join([BEGIN, "", *rows, "", text, "", END])


def readme_block(readme: str) -> str:
    """The README's block, markers included (a missing marker is an error naming it)."""
    for marker in (BEGIN, END):
        if readme.count(marker) != 1:
            raise SystemExit(f"README.md holds {readme.count(marker)} copies of the marker {marker!r}, not one")
    return readme[readme.index(BEGIN):readme.index(END) + len(END)]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        path = ROOT / "README.md"
        text = path.read_text()
        path.write_text(text.replace(readme_block(text), block()))
        return 0
    if argv:
        raise SystemExit("usage: python tools/readme_table.py [--write]")
    print(block())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
