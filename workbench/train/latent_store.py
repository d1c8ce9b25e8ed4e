"""A latent cache on disk: every item encoded once by the frozen base, shared by every run and rank.

    workbench cache-latents CONFIG --out DIR        # (under torchrun, ranks split the shards)
    training: {cache_latents: DIR}                  # train from it, memory-mapped

The directory holds ``shard-NNNNN.safetensors`` files (each item's tensors under ``"{i}/{key}"``,
its other fields as JSON in the shard's metadata) and ``cache.json``, the identity of what made it:
the backbone (type, config and a digest of its weights), the data config and the item count. A
training run refuses a cache whose identity differs from its own, naming the field.

Each shard has a manifest beside it (``shard-NNNNN.manifest.json``: its size and SHA-256, see
:mod:`workbench.integrity`). Shards are written whole (temporary file, flushed, renamed) and the
manifest after them, so a shard counts only once its manifest is there. A reader verifies each
shard the first time it opens it; a rerun of ``cache-latents`` verifies every shard already there,
keeps the intact ones and rewrites the damaged, truncated or unlisted ones. Files are created with
the user's umask (a cache is meant to be shared).
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

from workbench.core.capabilities import CachesLatents
from workbench.errors import DataError
from workbench.integrity import (
    ManifestDamaged,
    entry_of,
    manifest_bytes,
    mismatch,
    parse_manifest,
    write_atomic,
)

FORMAT = 1
SHARD = "shard-{:05d}.safetensors"
SHARD_MANIFEST = "shard-{:05d}.manifest.json"
IDENTITY = "cache.json"
FIX = "Rerun `workbench cache-latents CONFIG --out {root}`: it verifies every shard, " \
      "keeps the intact ones and rewrites the others."


def own_weights(base: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The backbone's own parameters and buffers by name, as it was built: the tensors an inside adapter
    attached to it (peft's LoRA layers) left out, and peft's ``.base_layer`` wrapping undone, so a cache
    made by the bare backbone is recognised by a run with a LoRA inside it."""
    owner = vars(base).get("_workbench_inside_adapter")  # an inside adapter marks the base it is attached to
    theirs = set() if owner is None else {id(t) for t in (*owner.parameters(), *owner.buffers())}
    return {name.replace(".base_layer.", "."): t for name, t in base.state_dict(keep_vars=True).items()
            if id(t) not in theirs}


def weights_digest(module: torch.nn.Module) -> str:
    """A digest of every parameter and buffer (names, shapes, dtypes, bytes) of ``module`` (its own,
    see :func:`own_weights`)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(own_weights(module).items()):
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
    return [] if found == expected else [f"{path or 'value'} is {found!r} in the cache, "
                                         f"{expected!r} in this run"]


def identity_mismatch(found: Mapping, expected: Mapping) -> str | None:
    """Where two identities differ, said in words (the first field that does); ``None`` when they agree."""
    words = {"format": "cache format", "backbone": "backbone (type and config)",
             "weights": "backbone weights", "data": "data config", "items": "number of items"}
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
            raise DataError(f"cache-latents: item {i} field '{key}' is a {type(value).__name__}; "
                            f"a cache holds tensors and plain values (bool, int, float, str, None). "
                            f"Convert it in the dataset.")
    return tensors, plain


def read_identity(root: Path, what: str) -> dict:
    """``cache.json`` of the cache in ``root``, with a DataError naming the file when it is damaged."""
    path = root / IDENTITY
    try:
        identity = json.loads(path.read_text())
        if not isinstance(identity, dict) or not isinstance(identity.get("items"), int):
            raise ValueError("no item count")
        return identity
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DataError(f"{what}: {path} is damaged ({type(err).__name__}: {err}); it says what the cache in "
                        f"{root} was made from. Delete {root} and rebuild it with "
                        f"`workbench cache-latents CONFIG --out {root}`.") from None


def shard_problem(root: Path, s: int, *, verified: bool = True) -> str | None:
    """Why shard ``s`` of the cache in ``root`` cannot be used, in words (``None``: it is intact).

    ``verified``: the cache lists every shard in a manifest; a shard of a cache without manifests is
    judged on whether it reads completely.
    """
    path = root / SHARD.format(s)
    if not path.exists():
        return f"{path.name} is missing"
    listing = root / SHARD_MANIFEST.format(s)
    if not listing.exists():
        if verified:
            return f"{path.name} has no manifest (its write did not finish)"
        return _unreadable(path)
    try:
        entries = parse_manifest(listing.read_bytes())
        expected = entries[path.name]
    except (ManifestDamaged, KeyError) as err:
        return f"{listing.name} is damaged ({err})"
    return mismatch(path.name, expected, path.read_bytes())


def _unreadable(path: Path) -> str | None:
    """Why a shard without a manifest does not read completely (``None``: every tensor reads)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            for key in f.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                f.get_tensor(key)
            for key, value in meta.items():
                if key.isdigit():
                    json.loads(value)
    except Exception as err:  # safetensors raises its own error type, OSError or ValueError
        return f"{path.name} does not read ({type(err).__name__}: {err})"
    return None


def write_cache(base: Any, dataset: Dataset, out: str | Path, *, identity: Mapping, shard_size: int = 256,
                rank: int = 0, world_size: int = 1, log=print, progress: bool = False) -> Path:
    """Encode ``dataset`` through ``base.encode_item`` into ``out``; returns ``out``.

    Rank ``r`` of ``world_size`` writes shards ``r, r + world_size, ...``. Shards already on disk
    are verified and kept when intact (resume), rewritten otherwise; a directory holding another
    identity's cache is refused. ``progress`` shows a bar over this rank's items.
    """
    from safetensors.torch import save as save_safetensors

    if not isinstance(base, CachesLatents):
        raise DataError(f"cache-latents: {type(base).__name__} does not declare CachesLatents, so it has no "
                        f"frozen work to do ahead; there is nothing to cache. Declare CachesLatents on the "
                        f"backbone with its encode_item(item).")
    if shard_size < 1:
        raise DataError(f"cache-latents: shard size must be >= 1, got {shard_size}.")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ident_path = out / IDENTITY
    if rank == 0:  # an identity whose write a killed process left unfinished
        for stale in out.glob(f".{IDENTITY}.tmp-*"):
            stale.unlink(missing_ok=True)
    verified = True
    if ident_path.exists():
        found = read_identity(out, "cache-latents")
        problem = identity_mismatch(found, identity)
        if problem:
            raise DataError(f"{out} holds a latent cache of something else ({problem}). Use another --out "
                            f"directory, or delete this one to rebuild it.")
        verified = bool(found.get("shard_manifests"))
        stored = found.get("shard_size")
        if stored is not None and int(stored) != shard_size:
            raise DataError(f"{out} holds a latent cache of {stored} items per shard; "
                            f"--shard-size {shard_size} would split it differently. "
                            f"Pass --shard-size {stored} to finish it, or use another --out.")
    if rank == 0 and not (ident_path.exists() and verified):  # (a cache without manifests gains them)
        write_atomic(ident_path, json.dumps({**dict(identity), "shard_manifests": True,
                                             "shard_size": shard_size},
                                            indent=1, sort_keys=True).encode())
    n = len(dataset)
    shards = (n + shard_size - 1) // shard_size
    mine = list(range(rank, shards, world_size))
    # what a process killed while writing one of this rank's shards left (no other rank writes them)
    for s in mine:
        for name in (SHARD.format(s), SHARD_MANIFEST.format(s)):
            for stale in out.glob(f".{name}.tmp-*"):
                stale.unlink(missing_ok=True)
    todo, kept, rewritten = [], 0, []
    for s in mine:
        problem = shard_problem(out, s, verified=verified) if (out / SHARD.format(s)).exists() else "missing"
        if problem is None:
            if not (out / SHARD_MANIFEST.format(s)).exists():  # an intact shard without its manifest
                _write_manifest(out, s, (out / SHARD.format(s)).read_bytes())
            kept += 1
        else:
            todo.append(s)
            if problem != "missing":
                rewritten.append(f"{SHARD.format(s)} ({problem})")
    for line in rewritten:
        log(f"cache-latents: rewriting {line}")
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        items = sum(min(n, (s + 1) * shard_size) - s * shard_size for s in todo)
        bar = tqdm(total=items, desc=f"cache-latents{f' rank {rank}' if world_size > 1 else ''}", unit="item")
    try:
        for s in todo:
            tensors, meta = {}, {}
            for i in range(s * shard_size, min(n, (s + 1) * shard_size)):
                item = base.encode_item(dataset[i])
                if item is None:
                    raise DataError(f"cache-latents: {type(base).__name__}.encode_item "
                                    f"has nothing to precompute for items of {type(dataset).__name__} "
                                    f"(it returned None); there is nothing to cache.")
                t, plain = _split(item, i)
                tensors.update(t)
                meta[str(i)] = json.dumps(plain)
                if bar is not None:
                    bar.update(1)
            data = _canonical(save_safetensors(tensors, metadata={**meta, "shard": str(s),
                                                                  "size": str(shard_size)}))
            # the shard counts again once it is listed
            (out / SHARD_MANIFEST.format(s)).unlink(missing_ok=True)
            write_atomic(out / SHARD.format(s), data)
            _write_manifest(out, s, data)
    finally:
        if bar is not None:
            bar.close()
    log(f"cache-latents: rank {rank}: {len(todo)} shard(s) written "
        f"({len(rewritten)} of them damaged before), {kept} already there and verified, into {out}")
    return out


def _canonical(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys in sorted order: the writer keeps its metadata in a
    hash map whose order changes from process to process, so the same shard would not be the same bytes
    (the header keeps its length: the same keys and values, and the writer's space padding)."""
    n = int.from_bytes(data[:8], "little")
    text = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    if len(text) > n:  # (never, for a header the writer made compact; left as written if it were not)
        return data
    return data[:8] + text.ljust(n, b" ") + data[8 + n:]


def _write_manifest(root: Path, s: int, data: bytes) -> None:
    write_atomic(root / SHARD_MANIFEST.format(s), manifest_bytes({SHARD.format(s): entry_of(data)}, shard=s))


class DiskLatentCache(Dataset):
    """A map-style dataset served from a latent cache directory, read through memory maps.

    Items come back exactly as ``base.encode_item`` returned them when the cache was written:
    bit-identical tensors, the same plain fields. Each process opens the shards it touches lazily.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        ident_path = self.root / IDENTITY
        if not ident_path.exists():
            raise DataError(f"training.cache_latents: {self.root} is not a latent cache (no {IDENTITY}). "
                            f"Write one with `workbench cache-latents CONFIG --out {self.root}`.")
        self.identity = read_identity(self.root, "training.cache_latents")
        self._n = int(self.identity["items"])
        self.verified = bool(self.identity.get("shard_manifests"))
        shards = sorted(self.root.glob("shard-*.safetensors"))
        if not shards:
            raise DataError(f"training.cache_latents: {self.root} has no shards yet; finish it with "
                            f"`workbench cache-latents CONFIG --out {self.root}` (it resumes).")
        self.shard_size = int(self.identity.get("shard_size") or self._stored_shard_size(shards[0]))
        expected_shards = (self._n + self.shard_size - 1) // self.shard_size
        missing = [SHARD.format(s) for s in range(expected_shards)
                   if not (self.root / SHARD.format(s)).exists()
                   or self.verified and not (self.root / SHARD_MANIFEST.format(s)).exists()]
        if missing:
            raise DataError(f"training.cache_latents: {self.root} is incomplete: "
                            f"{len(missing)} of {expected_shards} shards missing or unfinished "
                            f"(first: {missing[0]}). Rerun `workbench cache-latents` to finish it.")
        if not self.verified:
            import sys

            print(f"note: the latent cache {self.root} has no shard manifests "
                  f"(written by a workbench before caches carried digests): its shards are read "
                  f"but cannot be verified. Rerun `workbench cache-latents CONFIG --out {self.root}` "
                  f"to verify them and add the manifests.", file=sys.stderr)
        self._open: dict[int, tuple[Any, dict[int, list[str]]]] = {}

    def _stored_shard_size(self, first: Path) -> int:
        """The shard size recorded in a shard's metadata (for a cache whose ``cache.json`` lacks it)."""
        from safetensors import safe_open

        try:
            with safe_open(str(first), framework="pt") as f:
                return int(f.metadata()["size"])
        except Exception as err:  # safetensors' own error type, KeyError, ValueError
            raise self._damaged(first, f"{first.name} does not read ({type(err).__name__}: {err})") from None

    def _damaged(self, path: Path, problem: str) -> DataError:
        s = int(path.name.split("-")[1].split(".")[0]) if path.name.startswith("shard-") else None
        items = ""
        if s is not None and getattr(self, "shard_size", None):
            first = s * self.shard_size
            items = f" (items {first}–{min(self._n, first + self.shard_size) - 1})"
        return DataError(f"training.cache_latents: shard {path.name}{items} of the latent cache {self.root} "
                         f"is damaged: {problem}. " + FIX.format(root=self.root))

    def __len__(self) -> int:
        return self._n

    def require(self, expected: Mapping) -> None:
        """Refuse this cache unless it was made from what ``expected`` describes
        (see :func:`cache_identity`)."""
        problem = identity_mismatch(self.identity, expected)
        if problem:
            raise DataError(f"training.cache_latents: {self.root} was made for another run ({problem}). "
                            f"Rebuild it for this config with `workbench cache-latents CONFIG --out DIR`.")

    def _shard(self, s: int) -> tuple[Any, dict[int, list[str]]]:
        """The open shard ``s`` and, per item, the keys of its tensors."""
        entry = self._open.get(s)
        if entry is None:
            from safetensors import safe_open

            path = self.root / SHARD.format(s)
            problem = shard_problem(self.root, s) if self.verified else None  # read once, then memory-mapped
            if problem is not None:
                raise self._damaged(path, problem)
            try:
                handle = safe_open(str(path), framework="pt")
                keys: dict[int, list[str]] = {}
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                    keys.setdefault(int(key.split("/", 1)[0]), []).append(key)
            except Exception as err:  # safetensors' own error type, OSError, ValueError
                raise self._damaged(path, f"it does not read ({type(err).__name__}: {err})") from None
            entry = self._open[s] = (handle, keys)
        return entry

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -self._n <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} cached items")
        i = i % self._n
        f, keys = self._shard(i // self.shard_size)
        try:
            item: dict[str, Any] = json.loads(f.metadata()[str(i)])
            for key in keys.get(i, ()):
                item[key.split("/", 1)[1]] = f.get_tensor(key)
        except Exception as err:  # an unverified shard (no manifest): damage shows when it is read
            raise self._damaged(self.root / SHARD.format(i // self.shard_size),
                                f"item {i} does not read ({type(err).__name__}: {err})") from None
        return item

    def __getstate__(self) -> dict:  # DataLoader workers open their own handles
        return {**self.__dict__, "_open": {}}


def run(args) -> int:
    """``workbench cache-latents CONFIG --out DIR``: the config's dataset through its frozen backbone.

    Under ``torchrun`` each rank writes its share of the shards (``RANK`` / ``WORLD_SIZE``).
    """
    from workbench.config import build
    from workbench.train.config import load_yaml
    from workbench.train.options import DataOptions, apply_data_options

    config = apply_data_options(load_yaml(args.config), DataOptions.from_args(args), what=args.config)
    if config.data is None:
        raise DataError(f"cache-latents: {args.config} has no data: block, so there is nothing to encode. "
                        f"Add one (e.g. data: {{type: metaworld, config: {{path: sample}}}}).")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    with torch.random.fork_rng(devices=[]):  # the base is built exactly as a training run builds it
        torch.manual_seed(config.training.seed)
        base = build("backbone", config.base["type"], config.base.get("config"), where="base")
    dataset = build("dataset", config.data["type"], config.data.get("config"), where="data")
    identity = cache_identity(base, config.data, len(dataset))
    distributed = world > 1 and not torch.distributed.is_initialized()
    if distributed:
        from workbench.train.distributed import init_process_group

        init_process_group("gloo")
    try:
        write_cache(base, dataset, args.out, identity=identity, shard_size=args.shard_size, rank=rank,
                    world_size=world, progress=not getattr(args, "quiet", False) and rank == 0)
        if world > 1:
            torch.distributed.barrier()  # rank 0 reports a finished cache, not its own share
    finally:
        if distributed:
            torch.distributed.destroy_process_group()
    if rank == 0:
        print(f"cache-latents: {len(dataset)} items of {config.data['type']} cached in {args.out}. "
              f"Train from it with training: {{cache_latents: {args.out}}}.")
    return 0
