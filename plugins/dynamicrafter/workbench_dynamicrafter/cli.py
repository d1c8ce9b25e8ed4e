"""``workbench-dynamicrafter convert model.ckpt out.safetensors --trust-pickle``: the one-off conversion.

Official DynamiCrafter checkpoints are Lightning ``.ckpt`` pickles. ``from_checkpoint`` reads them
with ``torch.load(weights_only=True)``; where that refuses (pickled training state), this command
unpickles the file fully — only with ``--trust-pickle``, as unpickling can run code from the file —
and writes the flat state dict (``state_dict`` / DeepSpeed ``module`` unwrapped) as safetensors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def convert(source: str | Path, target: str | Path, *, trust_pickle: bool) -> Path:
    import torch
    from safetensors.torch import save_file

    from workbench.errors import CheckpointError
    from workbench_dynamicrafter.checkpoint import unwrap

    if not trust_pickle:
        raise CheckpointError("workbench-dynamicrafter convert unpickles the checkpoint, which can run code "
                              "stored in it. Pass --trust-pickle if the file comes from a source you trust "
                              "(e.g. the official Doubiiu/DynamiCrafter* releases).")
    state = unwrap(torch.load(str(source), map_location="cpu", weights_only=False))
    tensors = {k: v.contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
    skipped = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if skipped:
        raise CheckpointError(f"{source}: {len(skipped)} entries are not tensors "
                              f"(first: {', '.join(skipped[:5])}); this is not a DynamiCrafter state dict.")
    out = Path(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench-dynamicrafter", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    conv = commands.add_parser("convert", help="convert a pickled model.ckpt to safetensors")
    conv.add_argument("source")
    conv.add_argument("target")
    conv.add_argument("--trust-pickle", action="store_true",
                      help="allow the full unpickle this conversion needs")
    args = parser.parse_args(argv)
    from workbench.errors import CheckpointError

    try:
        out = convert(args.source, args.target, trust_pickle=args.trust_pickle)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
