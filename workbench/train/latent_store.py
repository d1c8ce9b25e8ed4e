"""A latent cache on disk: every item encoded once by the frozen base, shared by every run and rank.

    workbench cache-latents CONFIG --out DIR        # (under torchrun, ranks split the shards)
    training: {cache_latents: DIR}                  # train from it, memory-mapped

The directory holds ``shard-NNNNN.safetensors`` files (each item's tensors under ``"{i}/{key}"``,
its other fields as JSON in the shard's metadata) and ``cache.json``, the identity of what made it:
the backbone (type, config and a digest of its weights), the data config and the item count. A
training run refuses a cache whose identity differs from its own, naming the field. Shards are
written whole (temporary file, then rename), so an interrupted run resumes by skipping the shards
already there, and a reader never sees half a shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from workbench.errors import DataError

FORMAT = 1
SHARD = "shard-{:05d}.safetensors"
IDENTITY = "cache.json"


def weights_digest(module: torch.nn.Module) -> str:
    """A digest of every parameter and buffer (names, shapes, dtypes, bytes) of ``module``."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _with_defaults(kind: str, block: Mapping) -> dict:
    """A ``{type, config}`` block with every default filled in, so equal configs compare equal."""
    from workbench.config import Problems, raise_problems, to_dict, validate
    from workbench.registry import resolve

    config_class = getattr(resolve(kind, block["type"]), "config_class", None)
    if config_class is None:
        return {"type": block["type"], "config": dict(block.get("config") or {})}
    problems = Problems()
    config = validate(config_class, block.get("config") or {}, "data.config", problems)
    raise_problems(problems)
    return {"type": block["type"], "config": to_dict(config)}


def cache_identity(base: Any, data_block: Mapping | None, items: int) -> dict:
    """What a cache is a cache of: the backbone as built (type, config but its ``device``, weights),
    the data config block when known (defaults filled in), and the item count."""
    from workbench.config import block_of

    backbone = block_of(base, "backbone")
    if isinstance(backbone.get("config"), Mapping):  # where latents were computed is not what they are
        backbone = {**backbone, "config": {k: v for k, v in backbone["config"].items() if k != "device"}}
    return {"format": FORMAT, "backbone": backbone, "weights": weights_digest(base),
            "data": _with_defaults("dataset", data_block) if data_block else None, "items": int(items)}


def _differences(found: Any, expected: Any, path: str = "") -> list[str]:
    if isinstance(found, Mapping) and isinstance(expected, Mapping):
        out = []
        for key in sorted(set(found) | set(expected), key=str):
            out += _differences(found.get(key), expected.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if found == expected else [f"{path or 'value'} is {found!r} in the cache, {expected!r} in this run"]


def identity_mismatch(found: Mapping, expected: Mapping) -> str | None:
    """Where two identities differ, said in words (the first field that does); ``None`` when they agree."""
    words = {"format": "cache format", "backbone": "backbone (type and config)", "weights": "backbone weights",
             "data": "data config", "items": "number of items"}
    for field, what in words.items():
        if field == "data" and expected.get("data") is None:
            continue  # a run built in Python without a data block checks everything else
        diffs = _differences(found.get(field), expected.get(field))
        if diffs:
            return f"{what}: {'; '.join(diffs[:3])}"
    return None


def _split(item: Mapping[str, Any], i: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, plain = {}, {}
    for key, value in item.items():
        if isinstance(value, torch.Tensor):
            tensors[f"{i}/{key}"] = value.detach().cpu().contiguous()
        elif value is None or isinstance(value, (bool, int, float, str)):
            plain[key] = value
        else:
            raise DataError(f"cache-latents: item {i} field '{key}' is a {type(value).__name__}; a cache holds "
                            f"tensors and plain values (bool, int, float, str, None). Convert it in the dataset.")
    return tensors, plain


def write_cache(base: Any, dataset: Dataset, out: str | Path, *, identity: Mapping, shard_size: int = 256,
                rank: int = 0, world_size: int = 1, log=print) -> Path:
    """Encode ``dataset`` through ``base.encode_item`` into ``out``; returns ``out``.

    Rank ``r`` of ``world_size`` writes shards ``r, r + world_size, ...``. Shards already on disk
    are kept (resume); a directory holding another identity's cache is refused.
    """
    from safetensors.torch import save_file

    if shard_size < 1:
        raise DataError(f"cache-latents: shard size must be >= 1, got {shard_size}.")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ident_path = out / IDENTITY
    if ident_path.exists():
        problem = identity_mismatch(json.loads(ident_path.read_text()), identity)
        if problem:
            raise DataError(f"{out} holds a latent cache of something else ({problem}). Use another --out "
                            f"directory, or delete this one to rebuild it.")
    elif rank == 0:
        tmp = ident_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(identity), indent=1, sort_keys=True))
        os.replace(tmp, ident_path)
    n = len(dataset)
    shards = (n + shard_size - 1) // shard_size
    written = skipped = 0
    for s in range(rank, shards, world_size):
        path = out / SHARD.format(s)
        if path.exists():
            skipped += 1
            continue
        tensors, meta = {}, {}
        for i in range(s * shard_size, min(n, (s + 1) * shard_size)):
            item = base.encode_item(dataset[i])
            if item is None:
                raise DataError(f"cache-latents: {type(base).__name__}.encode_item has nothing to precompute for "
                                f"items of {type(dataset).__name__} (it returned None); there is nothing to cache.")
            t, plain = _split(item, i)
            tensors.update(t)
            meta[str(i)] = json.dumps(plain)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata={**meta, "shard": str(s), "size": str(shard_size)})
        os.replace(tmp, path)
        written += 1
    log(f"cache-latents: rank {rank}: {written} shard(s) written, {skipped} already there, into {out}")
    return out


class DiskLatentCache(Dataset):
    """A map-style dataset served from a latent cache directory, read through memory maps.

    Items come back exactly as ``base.encode_item`` returned them when the cache was written:
    bit-identical tensors, the same plain fields. Each process opens the shards it touches lazily.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        ident_path = self.root / IDENTITY
        if not ident_path.exists():
            raise DataError(f"training.cache_latents: {self.root} is not a latent cache (no {IDENTITY}). Write one "
                            f"with `workbench cache-latents CONFIG --out {self.root}`.")
        self.identity = json.loads(ident_path.read_text())
        self._n = int(self.identity["items"])
        shards = sorted(self.root.glob("shard-*.safetensors"))
        if not shards:
            raise DataError(f"training.cache_latents: {self.root} has no shards yet; finish it with "
                            f"`workbench cache-latents CONFIG --out {self.root}` (it resumes).")
        from safetensors import safe_open

        with safe_open(str(shards[0]), framework="pt") as f:
            self.shard_size = int(f.metadata()["size"])
        expected_shards = (self._n + self.shard_size - 1) // self.shard_size
        missing = [SHARD.format(s) for s in range(expected_shards) if not (self.root / SHARD.format(s)).exists()]
        if missing:
            raise DataError(f"training.cache_latents: {self.root} is incomplete: {len(missing)} of {expected_shards} "
                            f"shards missing (first: {missing[0]}). Rerun `workbench cache-latents` to finish it.")
        self._open: dict[int, tuple[Any, dict[int, list[str]]]] = {}

    def __len__(self) -> int:
        return self._n

    def require(self, expected: Mapping) -> None:
        """Refuse this cache unless it was made from what ``expected`` describes (see :func:`cache_identity`)."""
        problem = identity_mismatch(self.identity, expected)
        if problem:
            raise DataError(f"training.cache_latents: {self.root} was made for another run ({problem}). Rebuild it "
                            f"for this config with `workbench cache-latents CONFIG --out DIR`.")

    def _shard(self, s: int) -> tuple[Any, dict[int, list[str]]]:
        """The open shard ``s`` and, per item, the keys of its tensors."""
        entry = self._open.get(s)
        if entry is None:
            from safetensors import safe_open

            handle = safe_open(str(self.root / SHARD.format(s)), framework="pt")
            keys: dict[int, list[str]] = {}
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                keys.setdefault(int(key.split("/", 1)[0]), []).append(key)
            entry = self._open[s] = (handle, keys)
        return entry

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -self._n <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} cached items")
        i = i % self._n
        f, keys = self._shard(i // self.shard_size)
        item: dict[str, Any] = json.loads(f.metadata()[str(i)])
        for key in keys.get(i, ()):
            item[key.split("/", 1)[1]] = f.get_tensor(key)
        return item

    def __getstate__(self) -> dict:  # DataLoader workers open their own handles
        return {**self.__dict__, "_open": {}}


def run(args) -> int:
    """``workbench cache-latents CONFIG --out DIR``: the config's dataset through its frozen backbone.

    Under ``torchrun`` each rank writes its share of the shards (``RANK`` / ``WORLD_SIZE``).
    """
    from workbench.config import build
    from workbench.train.config import load_yaml

    config = load_yaml(args.config)
    if config.data is None:
        raise DataError(f"cache-latents: {args.config} has no data: block, so there is nothing to encode. Add one "
                        f"(e.g. data: {{type: metaworld, config: {{path: sample}}}}).")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    with torch.random.fork_rng(devices=[]):  # the base is built exactly as a training run builds it
        torch.manual_seed(config.training.seed)
        base = build("backbone", config.base["type"], config.base.get("config"), where="base")
    dataset = build("dataset", config.data["type"], config.data.get("config"), where="data")
    identity = cache_identity(base, config.data, len(dataset))
    distributed = world > 1 and not torch.distributed.is_initialized()
    if distributed:
        torch.distributed.init_process_group("gloo")
    try:
        write_cache(base, dataset, args.out, identity=identity, shard_size=args.shard_size, rank=rank,
                    world_size=world)
        if world > 1:
            torch.distributed.barrier()  # rank 0 reports a finished cache, not its own share
    finally:
        if distributed:
            torch.distributed.destroy_process_group()
    if rank == 0:
        print(f"cache-latents: {len(dataset)} items of {config.data['type']} cached in {args.out}. Train from it "
              f"with training: {{cache_latents: {args.out}}}.")
    return 0
