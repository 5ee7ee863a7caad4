#!/usr/bin/env python3
"""Writes a GPTQ checkpoint big enough that `wna16 repack` runs for a while.

The signal tests (output_paths.sh) need a repack that is still writing when
the signal arrives; the golden cases repack in milliseconds. This writes
DIR/config.json and DIR/model.safetensors: LAYERS MoE layers of EXPERTS
experts, hidden HIDDEN, intermediate INTER, 4-bit, group 128, symmetric.
The codes are zeros left as holes (a sparse file: quick to make, little
disk), the scales 1.0, the zero points GPTQ's 0x77777777 words; the repack
does the same work on them as on real weights.

usage: make_checkpoint.py DIR [LAYERS EXPERTS HIDDEN INTER]
"""

import json
import os
import struct
import sys

GS = 128


def tensors(layers, experts, hidden, inter):
    """(name, dtype, shape, fill) in file order; fill: bytes of one element
    pattern, or None for zeros."""
    out = []
    for layer in range(layers):
        for e in range(experts):
            for proj, k, n in (("gate_proj", hidden, inter),
                               ("up_proj", hidden, inter),
                               ("down_proj", inter, hidden)):
                p = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
                out.append((p + ".g_idx", "I32", [k], "g_idx"))
                out.append((p + ".qweight", "I32", [k // 8, n], None))
                out.append((p + ".qzeros", "I32", [k // GS, n // 8],
                            b"\x77\x77\x77\x77"))
                out.append((p + ".scales", "F16", [k // GS, n], b"\x00\x3c"))
    return out


def main():
    if len(sys.argv) not in (2, 6):
        sys.exit(__doc__)
    d = sys.argv[1]
    layers, experts, hidden, inter = (
        (int(a) for a in sys.argv[2:6]) if len(sys.argv) == 6
        else (4, 8, 1024, 1024))
    os.makedirs(d, exist_ok=True)
    size = {"I32": 4, "F16": 2}
    header, begin = {"__metadata__": {"format": "pt"}}, 0
    ts = tensors(layers, experts, hidden, inter)
    for name, dt, shape, _ in ts:
        nbytes = size[dt]
        for s in shape:
            nbytes *= s
        header[name] = {"dtype": dt, "shape": shape,
                        "data_offsets": [begin, begin + nbytes]}
        begin += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        base = f.tell()
        for name, dt, shape, fill in ts:
            lo, hi = header[name]["data_offsets"]
            if fill is None:
                continue
            f.seek(base + lo)
            if fill == "g_idx":
                f.write(struct.pack(f"<{shape[0]}i",
                                    *(i // GS for i in range(shape[0]))))
            else:
                f.write(fill * ((hi - lo) // len(fill)))
        f.truncate(base + begin)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": hidden,
        "moe_intermediate_size": inter,
        "num_experts": experts,
        "num_experts_per_tok": 2,
        "num_hidden_layers": layers,
        "torch_dtype": "float16",
        "quantization_config": {"quant_method": "gptq", "bits": 4,
                                "group_size": GS, "desc_act": False,
                                "sym": True},
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    main()
