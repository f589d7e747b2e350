"""Holds `kvindex decode` to frames captured from a real vLLM engine.

Why: the captures' `expect` comes from vLLM's own msgspec structs decoding the engine's own
bytes; kvindex's decoder must give the same normalized view (vectors README rule: a key whose
value is null and an absent key are equal).

Usage: python check_decode.py [--kvindex PATH] CAPTURE.jsonl...   (stdlib only)
Exits non-zero on any difference or decode error.
"""

import argparse
import json
import os
import subprocess
import sys

DEFAULT_KVINDEX = os.environ.get("KVINDEX_BIN", "/var/tmp/kvindex-target/debug/kvindex")


def drop_nulls(value):
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvindex", default=DEFAULT_KVINDEX)
    p.add_argument("captures", nargs="+")
    args = p.parse_args()
    bad = total = 0
    for path in args.captures:
        with open(path, "rb") as f:
            data = f.read()
        out = subprocess.run([args.kvindex, "decode"], input=data, capture_output=True, check=True).stdout
        records = [json.loads(line) for line in data.splitlines() if line.strip()]
        decoded = [json.loads(line) for line in out.splitlines() if line.strip()]
        if len(records) != len(decoded):
            print(f"{path}: {len(records)} records in, {len(decoded)} lines out")
            bad += 1
            continue
        for i, (rec, got) in enumerate(zip(records, decoded)):
            total += 1
            if drop_nulls(got) != drop_nulls(rec["expect"]):
                bad += 1
                print(f"{path}:{i + 1}: kvindex decode differs from vLLM's decode\n  kvindex: {json.dumps(got)[:600]}\n"
                      f"  vLLM:    {json.dumps(rec['expect'])[:600]}")
    print(f"check_decode: {total - bad}/{total} records decode as vLLM decodes them")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
