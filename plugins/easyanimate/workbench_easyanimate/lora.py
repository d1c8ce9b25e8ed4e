"""Load a LoRA exported by ``exp.export_lora`` into diffusers' own EasyAnimate pipeline.

diffusers has no LoRA loader for EasyAnimate (its pipeline has no ``load_lora_weights``, its
transformer no ``load_lora_adapter``), so a LoRA trained here is written in diffusers' layout
(``pytorch_lora_weights.safetensors``, keys ``transformer.<path>.lora_A.weight``, the peft config
in the file's metadata) and put into a plain pipeline through peft by :func:`load_lora`:

```python
from diffusers import EasyAnimatePipeline
from workbench_easyanimate.lora import load_lora

pipe = EasyAnimatePipeline.from_pretrained("/models/EasyAnimateV5.1-12b-zh-diffusers")
load_lora(pipe, "outputs/run/lora")          # the directory export_lora wrote, or the file
video = pipe(prompt="...", num_frames=49).frames
```
"""

from __future__ import annotations

import json
from pathlib import Path

from workbench.errors import CheckpointError

FILE = "pytorch_lora_weights.safetensors"


def load_lora(pipeline_or_transformer, path: str | Path, adapter_name: str = "default"):
    """Inject the LoRA at ``path`` (a directory holding ``pytorch_lora_weights.safetensors``, or the file)
    into an ``EasyAnimatePipeline``'s transformer (or the transformer itself) with peft; returns the
    transformer.

    The LoRA's rank, alpha and targets come from the file's metadata, so the adapted transformer
    computes what the workbench run sampled with.
    """
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from safetensors import safe_open

    transformer = getattr(pipeline_or_transformer, "transformer", pipeline_or_transformer)
    file = Path(path)
    file = file / FILE if file.is_dir() else file
    if not file.is_file():
        raise CheckpointError(f"easyanimate load_lora: no LoRA file at {str(path)!r}. Give the directory "
                              f"exp.export_lora wrote (holding {FILE}) or that file.")
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata() or {}
        state = {key: f.get_tensor(key)
                 for key in f.keys()}  # noqa: SIM118 (a safetensors handle is not iterable)
    configs = json.loads(metadata.get("lora_adapter_metadata", "{}"))
    config = configs.get("transformer")
    if config is None:
        raise CheckpointError(f"easyanimate load_lora: {file} carries no peft config for the transformer "
                              f"in its metadata (lora_adapter_metadata), "
                              f"so its rank and targets are unknown. Export the LoRA with exp.export_lora "
                              f"from an easyanimate run.")
    wanted = {k: config[k] for k in ("r", "lora_alpha", "lora_dropout", "target_modules") if k in config}
    inject_adapter_in_model(LoraConfig(**wanted), transformer, adapter_name=adapter_name)
    found = {}
    for name, module in transformer.named_modules():
        if hasattr(module, "lora_A") and adapter_name in getattr(module, "lora_A", {}):
            found[f"transformer.{name}.lora_A.weight"] = module.lora_A[adapter_name].weight
            found[f"transformer.{name}.lora_B.weight"] = module.lora_B[adapter_name].weight
    missing, unexpected = sorted(set(found) - set(state)), sorted(set(state) - set(found))
    if missing or unexpected:
        raise CheckpointError(f"easyanimate load_lora: {file} does not fit this transformer: "
                              f"missing {missing[:4]}, unexpected {unexpected[:4]}. "
                              f"Load it into the pipeline the LoRA was trained on.")
    with torch.no_grad():
        for key, weight in found.items():
            weight.copy_(state[key])
    return transformer


__all__ = ["load_lora"]
