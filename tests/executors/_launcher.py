"""A throwaway "server": launches one local job, prints its handle, then blocks.

The test SIGKILLs this process while the job runs, to play a server that dies.
Usage: ``python -m tests.executors._launcher SPEC_JSON`` (keys: job_id, command,
workdir, log_path, env, grace_s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shamal.executors import LaunchSpec, get_executor
from shamal.scheduler.core._resources import Placement, Slot


def main() -> None:
    raw = json.loads(sys.argv[1])
    spec = LaunchSpec(
        job_id=raw["job_id"],
        attempt=0,
        command=tuple(raw["command"]),
        workdir=Path(raw["workdir"]),
        env=raw["env"],
        placement=Placement((Slot("node-a", 500, 64),)),
        log_path=Path(raw["log_path"]),
        grace_s=float(raw["grace_s"]),
    )
    handle = get_executor("local").launch(spec)
    print(handle.to_json(), flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
