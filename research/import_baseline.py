"""Copy the ``workbench eval --rollout`` run of the shipped adapter (base and adapter, probe state) into
``outputs/r40/shipped/eval.json``, where :mod:`make_tables` reads every variant's numbers.

    workbench eval workbench/worldmodel/weights/metaworld_action --rollout --steps 8 --gate-scale 2 \\
        --variants base,adapter --out research/out/baseline_rollout
    python research/import_baseline.py
"""

import json
from pathlib import Path

rows = json.loads(Path("research/out/baseline_rollout/rollout_metrics.json").read_text())["summary"]["chunks"]
path = Path("outputs/r40/shipped/eval.json")
path.parent.mkdir(parents=True, exist_ok=True)
record = json.loads(path.read_text()) if path.exists() else {}
for v in ("base", "adapter"):
    record[f"rollout_{v}_hand_cm"] = [round(r[f"{v}_hand_error_cm"], 2) for r in rows]
    record[f"rollout_{v}_moving_psnr"] = [round(r[f"{v}_moving_psnr"], 2) for r in rows]
path.write_text(json.dumps(record, indent=1))
