"""Relay processes killed every few hundred milliseconds, for the outbox chaos test.

    python -m tests.resilience.outbox.chaos_relay --stop-file PATH [--min-life 0.1 ...]

A fresh `python -m jobs outbox relay` spends a second or two importing before its loop
starts, so killing it every 200 ms would kill it before it ever ran. This supervisor
imports the app once, then forks one relay process after another (each runs the same
`Relay.run` as `jobs outbox relay`, on connections of its own), SIGKILLs each after a
random 0.1-0.3 s of life, and prints `{"kills": n}` when the stop file appears.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import time
from pathlib import Path
from typing import Any


def warm_up(app: Any) -> None:
    """Import and build in the parent what every relay process would otherwise load on its
    first publish (no connection is opened here: each child opens its own)."""
    import importlib

    for module in ("jobs.broker", "kombu.transport.redis", "psycopg2.extras",
                   "resilience.deadletter.place", "resilience.outbox.backends.postgres",
                   "resilience.classify"):
        importlib.import_module(module)
    _ = app.amqp, app.backend, app.amqp.router
    for task in app.tasks.values():
        if hasattr(task, "pipelines"):
            task.pipelines()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--min-life", type=float, default=0.1)
    parser.add_argument("--max-life", type=float, default=0.3)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    options = parser.parse_args()

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    from jobs import app
    from resilience.outbox import Relay, RelayConfig

    app.loader.import_default_modules()
    warm_up(app)
    rng = random.Random(options.seed)
    stop = Path(options.stop_file)
    kills = 0
    while not stop.exists():
        pid = os.fork()
        if pid == 0:  # the relay process
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            logging.getLogger("chaos").info("relay process started")
            try:
                Relay(app, RelayConfig(batch_size=options.batch_size,
                                       poll_seconds=0.05)).run()
            finally:
                os._exit(0)
        time.sleep(rng.uniform(options.min_life, options.max_life))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kills += 1
    print(json.dumps({"kills": kills}), flush=True)


if __name__ == "__main__":
    main()
