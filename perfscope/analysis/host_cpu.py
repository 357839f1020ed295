"""Who held the cores of a busy host: this job or other processes.

A step that waited for cores (``host-contended``, :mod:`perfscope.analysis.evidence`) waited
either for the job's own threads and processes -- intra-op threads, DataLoader workers, more of
them than there are cores -- or for other work on the machine. The first is a finding with a knob
(``intra_op_threads`` / ``OMP_NUM_THREADS``, ``num_workers``: ``perfscope tune`` searches them);
the second is a property of the machine. The host record of ``perfscope profile`` holds, per
step, the machine's busy CPU time (``/proc/stat``), the training process's CPU time and its
child processes' (:mod:`perfscope.record.host_steps`); over the steps that have them:

- capacity: the steps' wall time times the machine's cores;
- this job: the training process (every thread) plus its children (DataLoader workers);
- other processes: the machine's busy time less this job's (other ranks of the same job on the
  same host count here: their processes are not the training process's children).

Each is a share of the capacity. The busy times come in clock ticks of 10 ms, so a single short
step's split is coarse; summed over the window it is not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.record.schema import HostCpu

# The job is the cause when its own processes used at least as much of the cores as everything
# else, and at least this share of them: below it, nothing of the job's oversubscribes anything.
JOB_SHARE = 0.5


def cpu_sources(rows: pd.DataFrame) -> HostCpu | None:
    """The split of the cores over ``rows`` (frame rows with the ``host_*`` columns).

    Returns:
        ``{"cores", "training_process", "workers", "others", "cause"}`` -- shares (0..1) of the
        cores' time, and ``cause`` ``"this job"`` or ``"other processes"`` -- or None where no
        row has the machine's busy time (traces of earlier versions, not Linux).
    """
    need = ["host_wall_us", "host_process_cpu_us", "host_machine_busy_us", "host_workers_cpu_us", "host_cores"]
    if rows.empty or any(c not in rows.columns for c in need):
        return None
    have = rows[need].dropna()
    have = have[(have["host_wall_us"] > 0) & (have["host_cores"] > 0)]
    if have.empty:
        return None
    capacity = float((have["host_wall_us"] * have["host_cores"]).sum())
    main = float(have["host_process_cpu_us"].sum())
    workers = float(have["host_workers_cpu_us"].sum())
    others = max(float(have["host_machine_busy_us"].sum()) - main - workers, 0.0)
    job = main + workers
    cause = "this job" if job >= others and job >= JOB_SHARE * capacity else "other processes"
    return HostCpu(cores=int(np.median(have["host_cores"])), training_process=min(main / capacity, 1.0),
                   workers=min(workers / capacity, 1.0), others=min(others / capacity, 1.0), cause=cause)


def sources_line(split: HostCpu) -> str:
    """The record's ``details.host_cpu`` in words, and what to do about it."""
    workers = split.workers or 0.0
    used = (f"of the {split.cores} cores' time, the training process used {split.training_process or 0.0:.0%}"
            + (f", its DataLoader workers {workers:.0%}" if workers >= 0.01 else "")
            + f", other processes {split.others or 0.0:.0%}")
    if split.cause == "this job":
        knobs = "fewer intra-op threads (torch.set_num_threads, OMP_NUM_THREADS)"
        if workers >= 0.05:
            knobs += " or DataLoader workers (num_workers)"
        return f"{used}: the job oversubscribes the cores itself; {knobs} (perfscope tune searches them)"
    return (f"{used}: other work holds the cores, a property of this machine; run where the job has its cores, "
            "or pin it to cores nobody else uses (taskset)")
