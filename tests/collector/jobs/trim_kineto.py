"""Trim real torch.profiler traces to what the Kineto importer reads, for small committed test data.

Keeps the file's metadata (distributedInfo, host_name, baseTimeNanoseconds, ...) and only the
ProfilerStep#N markers, communication events (gloo:*, record_param_comms, NCCL kernels, c10d::*)
and the CUDA runtime launches kernels point to; writes gzip like tensorboard_trace_handler.

    python tests/collector/jobs/trim_kineto.py SRC.pt.trace.json.gz DST.pt.trace.json.gz
"""

from __future__ import annotations

import gzip
import json
import re
import sys

KEEP = re.compile(r"^(ProfilerStep#\d+|gloo:.*|record_param_comms|nccl(Dev)?Kernel_.*|c10d::.*|cudaLaunchKernel.*)$")


def main(src: str, dst: str) -> None:
    with gzip.open(src, "rt") as f:
        data = json.load(f)
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("ph") == "X" and KEEP.match(str(e.get("name", "")))]
    with gzip.open(dst, "wt") as f:
        json.dump(data, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
