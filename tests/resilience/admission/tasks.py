"""Tasks for the bulkhead tests: small per-task admission limits, one task per policy.

Tests publish them to a private queue no worker consumes, so the queue fills up
deterministically whatever other workers the session runs.
"""

from __future__ import annotations

from jobs import app
from resilience.admission import bulkhead

#: The depth limit of the policy tasks below.
LIMIT = 5
#: The depth limit of the task the concurrent-producer test floods.
CONCURRENT_LIMIT = 20


@app.task(tier="optional", name="tests.bulkhead.abort")
@bulkhead(max_queue_depth=LIMIT, policy="abort", retry_after_seconds=7)
def bulkhead_abort(n: int) -> int:
    return n


@app.task(tier="optional", name="tests.bulkhead.discard")
@bulkhead(max_queue_depth=LIMIT, policy="discard")
def bulkhead_discard(n: int) -> int:
    return n


@app.task(tier="optional", name="tests.bulkhead.caller_runs")
@bulkhead(max_queue_depth=LIMIT, policy="caller_runs")
def bulkhead_caller_runs(n: int) -> int:
    return n * 10


@app.task(tier="optional", name="tests.bulkhead.wait")
@bulkhead(max_queue_depth=LIMIT, policy="wait", wait_timeout_seconds=0.2)
def bulkhead_wait(n: int) -> int:
    return n


@app.task(tier="optional", name="tests.bulkhead.concurrent")
@bulkhead(max_queue_depth=CONCURRENT_LIMIT, policy="abort")
def bulkhead_concurrent(n: int) -> int:
    return n
