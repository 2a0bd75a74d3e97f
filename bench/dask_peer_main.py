"""dask-jobqueue's SLURMCluster or SGECluster submitting held jobs: the peer the submission
benchmark races.

Run by bench/dask_peer.py with the peer's own interpreter (its venv has dask-jobqueue), as the
cluster account, where the scheduler is. It imports nothing of the project. It says on stdout
when the cluster is up (`ready`), the monotonic clock at the scale call (`scaling T`; the clock is
the machine's, so the bench compares it with its own), and closes the cluster, cancelling its
jobs, when a line arrives on stdin.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

# The peer's venv has it; the project's does not (it is no dependency of the platform).
from dask_jobqueue import SGECluster, SLURMCluster  # type: ignore[import-not-found,unused-ignore]

CLUSTERS = {"slurm": SLURMCluster, "gridengine": SGECluster}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", choices=sorted(CLUSTERS), default="slurm")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--job-name", required=True)
    parser.add_argument("--partition", required=True)
    parser.add_argument("--directive", action="append", default=[])
    parser.add_argument("--local-directory", required=True)
    args = parser.parse_args()
    # scale() runs every sbatch at once, each with its pipes: 1,000 jobs pass the usual soft limit
    # of 1,024 open files ("Too many open files"), as a user raising `ulimit -n` would avoid.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"open files {soft} -> {hard}", flush=True)
    cluster = CLUSTERS[args.scheduler](
        cores=1,
        processes=1,
        memory="1GB",
        queue=args.partition,
        walltime="00:10:00",
        job_name=args.job_name,
        job_extra_directives=args.directive,
        local_directory=args.local_directory,
        scheduler_options={"dashboard_address": None},
    )
    try:
        print("ready", flush=True)
        print(f"scaling {time.monotonic()!r}", flush=True)
        cluster.scale(jobs=args.jobs)
        sys.stdin.readline()
    finally:
        cluster.close(timeout=300)
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
