"""Drive key-press latency on the embedded world model (the adapter ``workbench demo`` ships, 64x64, 16-frame chunks).

A key press on the ``Drive`` view (no browser: the view's own handler, as the key field's message calls
it) predicts one chunk of a rollout, reads the hand probe off its frames and draws the picture. Measured
in CPU time of this single-threaded process, the median over presses, at 4, 8 (the view's default) and
20 sampling steps (the demo's); beside it the wall time and the load average, which on a shared machine
says how far wall time is from CPU time. Judged: a key press at 8 steps within 1.5 s of CPU time (the
browser target of 1.5 s, reachable only when the CPU is not shared; ``tests/test_widgets_drive_browser.py``
measures the browser). ``--quick``: one press per step count.
"""

from __future__ import annotations

import os
import sys
import time

from _bench import finish, judge, median, scaled, start

from workbench import AdapterExperiment
from workbench.data.metaworld import MetaWorldClips
from workbench.widgets import Drive
from workbench.worldmodel.demo import TRAINED_ADAPTER

KEYS = ("ArrowRight", "ArrowUp", "ArrowLeft", "ArrowDown", "PageUp")


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    clip = MetaWorldClips(path="sample", window=16, stride=16, split="val")[9]
    presses = scaled(5, 1)
    cpu_at = {}
    for steps in (4, 8, 20):
        # the hand probe reads each chunk's state and the path; the view opens on a first chunk (a warm-up)
        view = Drive(exp.model, start=clip, steps=steps, gate_scale=2.0, state="probe")
        cpu, wall, chunk = [], [], []
        for i in range(presses):
            c, w = time.process_time(), time.perf_counter()
            view.key(KEYS[i % len(KEYS)])
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
            chunk.append(view.state.timings[-1].cpu_s)
        cpu_at[steps] = median(cpu)
        print(f"Drive key press, {steps:2d} sampling steps: {median(cpu):.3f} s CPU (the chunk {median(chunk):.3f} s, "
              f"probe and picture the rest), {median(wall):.3f} s wall (median of {presses})")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    judge("Drive key press at 8 steps, CPU seconds", cpu_at[8], 1.5)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
