#!/usr/bin/env python3
"""A beam-nano checkpoint small enough to travel into a device call, and its loading for train.py --init-from.

  python3 tools/train/carry_checkpoint.py IN OUT [--format auto|bf16|int8] [--repo DIR]

IN is a checkpoint folder: config.json and model.safetensors, or the parts gpu_run.sh returns
(model.safetensors.part-*, joined in name order). OUT gets IN's JSON files and a model.safetensors of
- bf16: every tensor BF16 (round to nearest even), the router (mlp.gate.weight, e_score_correction_bias) F32 as
  docs/model-format.md requires; lossless for a checkpoint train.py wrote (it saves BF16 already);
- int8: every matrix but the router as I8 codes with one F32 scale a row (`NAME.row_scale`, the row's largest
  magnitude / 127; the value is code x scale, at most half a step off), vectors BF16, the router F32. For carrying
  only: the server does not load it. About half bf16's size (v3: 59.5 MB in BF16).
auto (default) writes bf16 when OUT and the repository's tree fit the 64 MiB a device call carries, else int8.
It prints OUT's size, the tree's (tracked and untracked files git does not ignore, in --repo, default this
repository; files under OUT not counted twice) and whether both together fit; exit status 1 when they do not.

train.py --init-from DIR reads any of these (and F32 tensors) through load_into(): each tensor must have the model's
shape, the router must be F32, and a matrix may be I8 with its row scales; config.json must equal the one --config
gives, key by key.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import safetensors_io  # noqa: E402
from beam_torch import ROUTER_SUFFIXES  # noqa: E402

CARRY_LIMIT = 64 * 1024 * 1024       # what a device call carries: the working tree and the carried paths together
SCALE_SUFFIX = ".row_scale"
PARTS = "model.safetensors.part-*"


def read_tensors(directory):
    """name -> safetensors_io.Tensor of a checkpoint folder: model.safetensors, its parts joined in name order, or
    the shards an index lists."""
    single = os.path.join(directory, "model.safetensors")
    parts = sorted(glob.glob(os.path.join(directory, PARTS)))
    if os.path.exists(single):
        return safetensors_io.load(single)
    if parts:
        data = b"".join(open(part, "rb").read() for part in parts)
        return safetensors_io.parse(data, f"{directory}/{PARTS} ({len(parts)} parts joined)")
    if os.path.exists(os.path.join(directory, "model.safetensors.index.json")):
        return safetensors_io.load_checkpoint_tensors(directory)
    raise ValueError(f"{directory}: no model.safetensors, {PARTS} or model.safetensors.index.json")


def check_config(expected, directory):
    """Refuses a checkpoint whose config.json differs from `expected` (the dict --config gives), naming the key."""
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        raise ValueError(f"{path} missing")
    with open(path) as f:
        found = json.load(f)
    for key in list(expected) + [k for k in found if k not in expected]:
        if expected.get(key, "(absent)") != found.get(key, "(absent)"):
            raise ValueError(f"{path}: key {key} is {found.get(key, '(absent)')!r}, the model of --config has "
                             f"{expected.get(key, '(absent)')!r}")


def to_float32(name, stored, tensors, where):
    """The float32 values of a stored tensor: F32/BF16/F16 widen exactly; I8 codes times their row scales."""
    if stored.dtype != "I8":
        return stored.to_float32()
    scale = tensors.get(name + SCALE_SUFFIX)
    if scale is None or scale.dtype != "F32" or list(scale.array.shape) != [stored.array.shape[0]]:
        found = "missing" if scale is None else f"{scale.dtype} {list(scale.array.shape)}"
        raise ValueError(f"{where}: tensor {name} is I8 and needs {name}{SCALE_SUFFIX} F32 "
                         f"[{stored.array.shape[0]}], found {found}")
    return stored.array.astype(np.float32) * scale.array[:, None]


def load_into(model, directory):
    """Copies a checkpoint folder's tensors into `model` (its parameters and the routers' bias buffers), refusing a
    missing, extra, misshapen or wrongly typed tensor by name. Returns {stored dtype: tensor count}."""
    tensors = read_tensors(directory)
    state = model.state_dict()
    counts = {}
    for name, target in state.items():
        stored = tensors.get(name)
        if stored is None:
            raise ValueError(f"{directory}: tensor {name} missing, expected shape {list(target.shape)}")
        allowed = ("F32",) if name.endswith(ROUTER_SUFFIXES) else ("F32", "BF16", "F16") + (
            ("I8",) if target.ndim == 2 else ())
        if list(stored.array.shape) != list(target.shape) or stored.dtype not in allowed:
            raise ValueError(f"{directory}: tensor {name} is {stored.dtype} {list(stored.array.shape)}, expected "
                             f"{' or '.join(allowed)} {list(target.shape)}")
        with torch.no_grad():
            target.copy_(torch.from_numpy(np.array(to_float32(name, stored, tensors, directory))))
        counts[stored.dtype] = counts.get(stored.dtype, 0) + 1
    extra = sorted(n for n in tensors if n not in state and not (n.endswith(SCALE_SUFFIX)
                                                                  and n[:-len(SCALE_SUFFIX)] in state))
    if extra:
        raise ValueError(f"{directory}: tensors the model does not have: {extra[:5]}")
    return counts


def carried(name, values, fmt):
    """name -> Tensor(s) of one tensor in the carry format."""
    if name.endswith(ROUTER_SUFFIXES):
        return {name: safetensors_io.Tensor("F32", values)}
    if fmt == "int8" and values.ndim == 2:
        peak = np.abs(values).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        codes = np.clip(np.rint(values / scale[:, None]), -127, 127).astype(np.int8)
        return {name: safetensors_io.Tensor("I8", codes), name + SCALE_SUFFIX: safetensors_io.Tensor("F32", scale)}
    return {name: safetensors_io.Tensor("BF16", safetensors_io.float32_to_bf16_bits(values))}


def write(in_dir, out_dir, fmt):
    tensors = read_tensors(in_dir)
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for name, stored in tensors.items():
        if name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in tensors:
            continue
        out.update(carried(name, np.asarray(to_float32(name, stored, tensors, in_dir)), fmt))
    safetensors_io.save(os.path.join(out_dir, "model.safetensors"), out, {"format": "pt", "carry": fmt})
    for path in glob.glob(os.path.join(in_dir, "*.json")):
        if not path.endswith("model.safetensors.index.json"):
            shutil.copyfile(path, os.path.join(out_dir, os.path.basename(path)))


def folder_bytes(directory):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(directory) for f in files)


def tree_bytes(repo, skip):
    """Bytes of what a device call sends of `repo`: tracked files and untracked ones git does not ignore (files
    under `skip` left out)."""
    listing = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout.decode().split("\0")
    skip = os.path.abspath(skip) + os.sep
    paths = {os.path.abspath(os.path.join(repo, p)) for p in listing if p}
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p) and not p.startswith(skip))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--format", choices=["auto", "bf16", "int8"], default="auto")
    parser.add_argument("--repo", default=ROOT, help="the checkout whose tree travels with it (default: this one)")
    args = parser.parse_args()
    tree = tree_bytes(args.repo, args.output)
    formats = ["bf16", "int8"] if args.format == "auto" else [args.format]
    for fmt in formats:
        if os.path.isdir(args.output):
            shutil.rmtree(args.output)
        write(args.input, args.output, fmt)
        size = folder_bytes(args.output)
        fits = size + tree <= CARRY_LIMIT
        print(f"{args.output}: {fmt}, {size / 1e6:.2f} MB; tree of {args.repo}: {tree / 1e6:.2f} MB; together "
              f"{(size + tree) / 1e6:.2f} MB of {CARRY_LIMIT / 1e6:.2f} MB (64 MiB): "
              f"{'fits' if fits else 'does NOT fit'}")
        if fits:
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
