#!/usr/bin/env python3
"""shard_checkpoint.py SRC DST [N [LAYERS]] - writes the checkpoint
directory SRC (config.json + model.safetensors) to DST as a sharded
Hugging Face checkpoint: model-0000i-of-0000N.safetensors files holding the
tensors in turn, and model.safetensors.index.json mapping each tensor to
its shard. With LAYERS > 1, model.layers.0.* is repeated as
model.layers.1.* ... (a deeper model from a one-layer one). Plain Python
(no numpy): the examples are run on it by host_install."""
import json
import os
import shutil
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    return meta, header, data


def write(path, meta, tensors):
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    layers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    meta, header, data = read(os.path.join(src, "model.safetensors"))
    first = "model.layers.0."
    for layer in range(1, layers):
        for k in [k for k in header if k.startswith(first)]:
            header[f"model.layers.{layer}." + k[len(first):]] = header[k]
    names = sorted(header, key=lambda k: (header[k]["data_offsets"][0], k))
    shards = [dict() for _ in range(n)]
    for i, name in enumerate(names):
        t = header[name]
        a, b = t["data_offsets"]
        shards[i * n // len(names)][name] = (t["dtype"], t["shape"],
                                             data[a:b])
    weight_map = {}
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write(os.path.join(dst, fname), meta, tensors)
        weight_map.update({k: fname for k in tensors})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(
                       len(b) for sh in shards for _, _, b in sh.values())},
                   "weight_map": weight_map}, f, indent=1)


if __name__ == "__main__":
    main()
