#!/usr/bin/env python3
"""Generate oi2jax/ops/optable.json from OpenInfer's ops.json (run from the repo root).

    python tools/gen_optable.py [path/to/ops.json]

The package reads only the generated file; it never looks at ../shared at run time.
The output keeps what oi2jax uses: per op arity, broadcast/inplace/accumulate flags,
attribute names, type rule, category, the FIRST-input dtype list and the accumulate
(input, acc) pairs; plus the attribute definitions and cast's output dtypes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SRC = ROOT.parent / "shared" / "openinfer" / "ops.json"
DST = ROOT / "oi2jax" / "ops" / "optable.json"


def build(src: dict) -> dict:
    sets = src["dtype_sets"]
    ops = {}
    for op in src["ops"]:
        support = sets[op["dtype_support_ref"]]
        if op["inputs"]["arity"] != "fixed" or op["outputs"]["count"] != 1:
            raise SystemExit(f"unexpected arity for {op['name']}")
        entry = {
            "category": op["category"],
            "arity": op["inputs"]["count"],
            "attrs": list(op["attrs"]),
            "broadcast": op["broadcast"] == "allow",
            "inplace": op["inplace"] == "allow",
            "accumulate": op["accumulate"] == "allow",
            "type_rule": op["type_rule"],
            "normal": list(support["normal"]),
            "accumulate_pairs": [[p["input"], p["acc"]] for p in support["accumulate"]],
        }
        if "output_dtypes_ref" in op:
            entry["output_dtypes"] = list(src["output_dtype_sets"][op["output_dtypes_ref"]])
        ops[op["name"]] = entry
    return {"version": src["version"], "attr_defs": src["attr_defs"], "ops": ops}


def main(argv: list[str]) -> int:
    src_path = Path(argv[1]) if len(argv) > 1 else DEFAULT_SRC
    table = build(json.loads(src_path.read_text()))
    DST.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DST.relative_to(ROOT)} ({len(table['ops'])} ops)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
