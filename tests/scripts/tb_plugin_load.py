"""Load a folder of traces with the TensorBoard profiler plugin's own loader; print what it found
as JSON: ``{"run": name, "profiles": [{"worker", "span", "steps": [...]}]}``.

A script, not a test module: the plugin's loader starts worker processes, which need a main
module of their own."""

import json
import sys

from torch_tb_profiler import io
from torch_tb_profiler.profiler.loader import RunLoader

if __name__ == "__main__":
    run = RunLoader("traces", sys.argv[1], io.Cache()).load()
    found = []
    for (worker, span), profile in run.profiles.items():
        rows = ((getattr(profile, "overview", None) or {}).get("steps") or {}).get("rows") or []
        found.append({"worker": worker, "span": span, "steps": [r[0] for r in rows]})
    print(json.dumps({"run": run.name, "profiles": found}))
