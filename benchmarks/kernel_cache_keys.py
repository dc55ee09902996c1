"""Do the Circle cache's keys part the kernel selections? The same items run under the CPU's own kernels and
under the scalar ones (ATEN_CPU_CAPABILITY=default), each on an empty cache of its own; prints how many entries
each wrote, how many keys both wrote, and how many of those hold different bytes.

    ./scripts/env.sh python benchmarks/kernel_cache_keys.py [--workers 2] [PYTEST ARGS ...]

Why it matters: .ci/run keeps the scalar-kernel matrix job's entries in the project's caches. A key both
selections write would let one selection's conversion answer the other's run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SELECTION = ("cases/nn.py", "cases/llama.py", "-k", "circle_replay or qparam_audit")


def _entries(cache: Path) -> dict[str, str]:
    """Circle entry key -> the sha256 of its payload, read from each manifest."""
    return {p.stem: json.loads(p.read_text())["payload_sha256"] for p in cache.rglob("*.json")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="xdist workers of each run (0: none)")
    options, selection = parser.parse_known_args()
    selection = selection or list(DEFAULT_SELECTION)
    written = {}
    with tempfile.TemporaryDirectory(prefix="kernel-keys-") as scratch:
        for name, kernels in (("native", None), ("scalar", "default")):
            env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
            if kernels:
                env["ATEN_CPU_CAPABILITY"] = kernels
            root = Path(scratch) / name
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(options.workers)]
            command += [f"--circle-cache={root / 'circle'}", f"--export-cache={root / 'export'}"]
            command += [f"--wrapq-report-dir={root / 'reports'}", *selection]
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
            closing = done.stdout.splitlines()[-1] if done.stdout else done.stderr[-300:]
            print(f"{name}: exit {done.returncode}, {closing}")
            if done.returncode not in (0, 1):
                return 1
            written[name] = _entries(root / "circle")
    common = set(written["native"]) & set(written["scalar"])
    differing = sum(written["native"][key] != written["scalar"][key] for key in common)
    print(
        f"Circle entries: native {len(written['native'])}, scalar {len(written['scalar'])}; "
        f"keys written by both {len(common)}, of them with different bytes {differing}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
