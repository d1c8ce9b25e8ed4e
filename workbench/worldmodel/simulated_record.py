"""The simulator twin's closed-loop outcomes of the shipped policies, recorded once and shipped.

A scripted policy's outcome in the simulator from a fixed start state does not depend on the world model:
:func:`record_simulated` runs the shipped family in the simulator twin
(:func:`~workbench.worldmodel.simulator_twin.simulate`) from every start state of the shipped recording,
under the embedded world model's decision rule, and writes the outcomes with the command, date, versions
and each start state's fingerprint. :func:`load_simulated` reads them back, checked against the start states
they are used with, so ``workbench demo`` ranks its imagined closed loops without a simulator.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m workbench.worldmodel.simulated_record
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import DataError, PolicyError, listing
from workbench.worldmodel.closed_loop_eval import (
    DEFAULT_BATCH,
    Plan,
    StartStates,
    execute,
    jobs,
    starts_from_recording,
)

#: The simulator twin's closed-loop outcomes of the shipped family from the shipped recording's start states
#: (:func:`record_simulated`). A scripted policy's outcome in the simulator from a fixed start state does not
#: depend on the world model, so ``workbench demo`` ranks its imagined closed loops against this record and
#: needs no simulator.
SIMULATED_PATH = Path(__file__).resolve().parents[1] / "data" / "samples" / "metaworld_closed_loop_sim.json"
RECORD_FORMAT = 1
#: The shipped record's command. Its kernels are part of it: the policies read the probes off the simulator's
#: frames, and through contact a push outcome follows the probes' last digits (with AVX-512 kernels the expert
#: with noise 0.3 ends 3.5 cm further from one push goal), so the record is made, and checked, with AVX2. The
#: CPU's maker counts too: with the same AVX2 kernels an Intel Xeon reads the probes to other last bits than
#: the AMD EPYC that made the shipped record, and there the same push ends 3.5 cm away (the reach outcomes,
#: without contact, agree to the record's last digit). The record names its CPU's maker.
RECORD_COMMAND = ("ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
                  "python -m workbench.worldmodel.simulated_record "
                  "--out workbench/data/samples/metaworld_closed_loop_sim.json")


def start_digests(starts: StartStates) -> list[str]:
    """Each start state's fingerprint: the SHA-256 of its task, index, start frame, hand, proprioception,
    object and goal, so that a record of outcomes is used only with the start states it was made from."""
    import hashlib

    out = []
    for r in range(len(starts)):
        h = hashlib.sha256(f"{starts.task[r]}/{int(starts.index[r])}/{int(starts.task_index[r])}".encode())
        h.update(np.ascontiguousarray(starts.frame[r], np.uint8).tobytes())
        for key in ("ee_pos", "proprio", "object_pos", "goal"):
            h.update(np.ascontiguousarray(getattr(starts, key)[r], np.float32).tobytes())
        out.append(h.hexdigest())
    return out


def cpu_vendor() -> str:
    """The CPU's maker as the processor names itself (``AuthenticAMD``, ``GenuineIntel``; ``/proc/cpuinfo``),
    or ``unknown``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    found = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    return found.group(1) if found else "unknown"


def _embedded_rule() -> tuple[int, int]:
    """The chunk length and context of the embedded world model, the decision rule a record is made for."""
    from workbench.config import build

    base = build("backbone", "tiny_video", {"weights": "pretrained", "device": "cpu"})
    return int(base.clip().frames), int(getattr(base.card, "context_frames", 1))


def record_simulated(out: str | Path = SIMULATED_PATH, *, recording: str | Path | None = None,
                     frames: int | None = None, seed: int = 0, processes: int = 1,
                     progress: bool = True) -> Path:
    """Run the shipped family (:func:`~workbench.worldmodel.policies.policy_names`) closed loop in the
    simulator twin (:func:`simulate`) from every start state of a policy recording, under the decision rule
    of the embedded world model, and write their outcomes as JSON, with the command, date and versions that
    made them and each start state's fingerprint (:func:`start_digests`). :func:`load_simulated` reads it.

    Args:
        out: The JSON file to write (default: the shipped :data:`SIMULATED_PATH`).
        recording: The policy recording whose start states are used (default: the shipped one).
        frames: The episodes' length in frames (default: the recording's).
        seed: The seed of the policies' noise, as :func:`resolve_policy` takes it.
        processes: Processes the policies are spread over (the numbers are the same for any).
        progress: Print each policy as it finishes.

    Returns:
        The path written.
    """
    import platform

    import torch

    from workbench.extras import distribution_version
    from workbench.worldmodel.policies import load_policies, policy_names
    from workbench.worldmodel.sim import import_simulator

    mujoco = import_simulator()
    episodes = load_policies(recording)
    starts = starts_from_recording(episodes)
    frames = int(frames or episodes.meta["frames"])
    window, context = _embedded_rule()
    names = policy_names()
    plan = Plan({}, starts, {k: k for k in names}, frames, 0, int(seed), None, DEFAULT_BATCH, window, context)
    done = execute(jobs(plan, [], True), plan, processes=processes, progress=progress)
    errors = [d["error"] for d in done if "error" in d]
    if errors:
        raise PolicyError(errors[0])
    by_key = {d["job"][1]: d for d in done}
    source = episodes.path.name if episodes.path else "a recording"
    record = {
        "format": RECORD_FORMAT, "generator": f"{__name__}.record_simulated",
        "command": _record_command(out, recording, None if frames == episodes.meta["frames"] else frames,
                                   seed),
        "date": time.strftime("%Y-%m-%d"),
        "versions": {"metaworld": distribution_version("metaworld"), "mujoco": mujoco.__version__,
                     "torch": distribution_version("torch"), "python": platform.python_version()},
        "kernels": {"torch": torch.backends.cpu.get_cpu_capability(),
                    "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"), "cpu_vendor": cpu_vendor()},
        "decision_rule": {"frames": frames, "window": window, "context": context, "seed": int(seed)},
        "start_states": {"recording": source, "seed": int(starts.meta["seed"]), "tasks": starts.tasks,
                         "per_task": starts.per_task,
                         "rows": [{"task": str(t), "index": int(i), "sha256": d} for t, i, d in
                                  zip(starts.task, starts.index, start_digests(starts), strict=True)]},
        "policies": names,
        "simulated_distance_m": {k: _metres(by_key[k]["distance"]) for k in names},
        "probed_distance_m": {k: _metres(by_key[k]["probed"]) for k in names},
        "cpu_seconds": round(sum(d["cpu_seconds"] for d in done), 1),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    if progress:
        print(f"wrote {out}: {len(names)} policies x {len(starts)} start states, "
              f"{record['cpu_seconds']} CPU s")
    return out



def _metres(values: np.ndarray) -> list[float]:
    """Distances in metres to the micrometre, as the record stores them."""
    return [round(float(v), 5) for v in values]


def _record_command(out: str | Path, recording: str | Path | None, frames: int | None, seed: int) -> str:
    """The command line that makes the record ``out`` again (the shipped one's: :data:`RECORD_COMMAND`)."""
    shipped = Path(out).resolve() == SIMULATED_PATH
    parts = [RECORD_COMMAND if shipped else RECORD_COMMAND.split(" --out ")[0] + f" --out {out}"]
    parts += [f"--recording {recording}"] * (recording is not None)
    parts += [f"--frames {frames}"] * (frames is not None) + [f"--seed {seed}"] * (seed != 0)
    return " ".join(parts)


def load_simulated(starts: StartStates, policies: Sequence[str], *, frames: int, seed: int = 0,
                   path: str | Path | None = None) -> dict[str, Any]:
    """The simulator twin's outcomes of ``policies`` from ``starts`` as a record of :func:`record_simulated`
    holds them, checked: the record must have been made from the same start states (their fingerprints), for
    episodes of ``frames`` frames and the policies' ``seed``, and hold every policy.

    Returns:
        ``jobs`` (one simulator job's result per policy, as :func:`run_job` gives it, for :func:`assemble`),
        ``window`` and ``context`` (the world model's chunk the decision rule was made for: check the model
        with :func:`check_rule`), ``record`` (the file's name), ``command`` and ``date``.

    Raises:
        DataError: When the record is missing or damaged, or was made for other start states, another
            decision rule or other policies; the message gives the command that makes it again.
    """
    path = Path(path) if path is not None else SIMULATED_PATH
    again = f"Make it again with `{RECORD_COMMAND}` (needs Meta-World)."
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise DataError(f"The simulator's record of closed-loop outcomes is missing: {path}. "
                        f"{again}") from err
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is not a record of closed-loop outcomes ({type(err).__name__}: {err}). "
                        f"{again}") from err
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        got = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{path}: format {got!r}, but this version reads format {RECORD_FORMAT}. {again}")
    rule = record["decision_rule"]
    want = {"frames": int(frames), "seed": int(seed)}
    if {k: rule[k] for k in want} != want:
        raise DataError(f"{path} holds episodes of {rule['frames']} frames with policy seed {rule['seed']}, "
                        f"but these are {frames} frames with seed {seed}. {again}")
    rows = {(r["task"], r["index"]): (i, r["sha256"]) for i, r in enumerate(record["start_states"]["rows"])}
    digests = start_digests(starts)
    picked = []
    for r in range(len(starts)):
        key = (str(starts.task[r]), int(starts.index[r]))
        if key not in rows or rows[key][1] != digests[r]:
            what = "holds no" if key not in rows else "was made from another"
            raise DataError(f"{path} {what} start state {key[0]} #{key[1]} ({starts.meta['source']}): its "
                            f"outcomes belong to the start states of {record['start_states']['recording']}. "
                            f"{again}")
        picked.append(rows[key][0])
    missing = [k for k in policies if k not in record["simulated_distance_m"]]
    if missing:
        raise DataError(f"{path} holds no outcomes of {listing(missing)}; it holds "
                        f"{listing(list(record['simulated_distance_m']))}. {again}")
    done = [{"job": ("sim", k), "distance": np.asarray(record["simulated_distance_m"][k], np.float64)[picked],
             "probed": np.asarray(record["probed_distance_m"][k], np.float64)[picked], "cpu_seconds": 0.0}
            for k in policies]
    return {"jobs": done, "window": int(rule["window"]), "context": int(rule["context"]), "record": path.name,
            "command": record["command"], "date": record["date"]}


def check_rule(model: Any, window: int, context: int, path: str | Path = SIMULATED_PATH) -> None:
    """Refuse a world model whose chunks are not the ``window`` frames continuing from ``context`` frames a
    record of simulated outcomes (``path``) was made for: its policies would be asked at other frames."""
    card = model.base.card
    got = (int(model.base.clip().frames), int(getattr(card, "context_frames", 1)))
    if got != (window, context):
        raise DataError(f"{Path(path).name} was made for a world model of {window}-frame chunks continuing "
                        f"from {context} frame(s), where the policies choose their actions; this model's "
                        f"chunks are {got[0]} frames from {got[1]}. Judge it against the simulator itself: "
                        f"workbench eval RUN --policies (needs Meta-World).")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m workbench.worldmodel.simulated_record",
                                     description="Record the simulator twin's closed-loop outcomes of the "
                                                 "shipped policies from a recording's start states.")
    parser.add_argument("--out", default=str(SIMULATED_PATH), help="the JSON to write (default: the shipped)")
    parser.add_argument("--recording", default=None, help="a policy recording (default: the shipped one)")
    parser.add_argument("--frames", type=int, default=None,
                        help="frames per episode (default: the recording's)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--processes", type=int, default=1, help="(default: %(default)s)")
    args = parser.parse_args(argv)
    record_simulated(args.out, recording=args.recording, frames=args.frames, seed=args.seed,
                     processes=args.processes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["RECORD_COMMAND", "SIMULATED_PATH", "check_rule", "load_simulated", "record_simulated",
           "start_digests"]
