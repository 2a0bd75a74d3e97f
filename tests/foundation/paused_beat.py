"""A beat process that stops itself (SIGSTOP) at its first send, after taking the lease and
before publishing: a holder paused mid-send. tests/foundation/test_beat_fencing.py continues it
once another holder has the lease.

    python -m tests.foundation.paused_beat SCHEDULE_FILE
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import django


def main(schedule_file: str) -> None:
    django.setup()
    from activate.celery import app
    from core.beat import LeasedScheduler

    class PausedMidSend(LeasedScheduler):
        paused = False

        def apply_async(
            self, entry: Any, producer: Any = None, advance: bool = True, **kw: Any
        ) -> Any:
            if not self.paused and self.lease is not None:
                self.paused = True
                print(f"pausing under fence {self.lease.fence}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
                print("continued", flush=True)
            return super().apply_async(entry, producer, advance, **kw)

    app.conf.beat_schedule = {
        "sweep-heartbeats": {"task": "workers_app.tasks.sweep_heartbeats", "schedule": 0.2}
    }
    scheduler = PausedMidSend(app=app, schedule_filename=schedule_file)
    while True:
        time.sleep(max(0.0, scheduler.tick()))


if __name__ == "__main__":
    main(sys.argv[1])
