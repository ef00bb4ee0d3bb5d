"""The task queue of the tests and benchmarks: tasks wait until the caller delivers them.

Handed to `create_app(..., task_queue=DrainedQueue())`; the app's own code enqueues through its `TaskRouter` as on
App Engine, and the test delivers each task through the app's task route (`/api/tasks/<name>`), one at a time or on
threads, and may make a delivery fail to see the retry.
"""
import collections
import logging
import threading
import time

from core.tasks import NAME_HEADER, QUEUE_HEADER, RETRY_HEADER, TOKEN_HEADER, Task

log = logging.getLogger(__name__)


def local_headers(token: str, task: Task) -> dict[str, str]:
    """The headers a test's or a benchmark's queue delivers `task` with: the token, and App Engine's task headers as
    Cloud Tasks sends them (devstack/cloudtasks.py sends the same)."""
    return {"Content-Type": "application/json", TOKEN_HEADER: token, QUEUE_HEADER: "mapper",
            RETRY_HEADER: str(task.delivery), NAME_HEADER: task.name}


class DrainedQueue:
    """For tests: enqueued tasks wait here until `drain` delivers them (through the app's task route)."""

    def __init__(self):
        self.pending = collections.deque()
        self.names = set()
        self.lock = threading.Lock()

    def enqueue(self, name, payload, task_name, delay=0):
        """`delay` is not waited for: the test decides when tasks run (a delayed task joins the line at once)."""
        with self.lock:
            if task_name in self.names:
                return
            self.names.add(task_name)
            self.pending.append(Task(name, payload, task_name, 0))

    def take(self):
        with self.lock:
            return self.pending.popleft() if self.pending else None

    def drain(self, deliver, workers=1, max_deliveries=10_000, timeout=300):
        """Deliver until no task is left: deliver(task) -> True when it succeeded; a failed task goes to the back of
        the line with delivery + 1 (as a queue retries it). Bounded in deliveries and time: tasks left when the time
        runs out are an error, tasks left after `max_deliveries` are not. Returns the number of deliveries."""
        deadline, count, count_lock = time.monotonic() + timeout, [0], threading.Lock()
        busy = [0]

        def worker():
            while time.monotonic() < deadline:
                with count_lock:
                    if count[0] >= max_deliveries:
                        return
                    task = self.take()
                    if task is None:
                        if busy[0] == 0:
                            return
                    else:
                        count[0] += 1
                        busy[0] += 1
                if task is None:
                    time.sleep(0.01)  # another worker's task may still enqueue children
                    continue
                try:
                    ok = deliver(task)
                except Exception:  # noqa: BLE001 - a delivery that raised failed, as a 500 would
                    log.exception("task %s failed", task.name)
                    ok = False
                with count_lock:
                    if not ok:  # back in line before this worker stops counting as busy
                        with self.lock:
                            self.pending.append(task._replace(delivery=task.delivery + 1))
                    busy[0] -= 1
        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.pending and count[0] < max_deliveries:
            raise RuntimeError(f"queue not drained: {len(self.pending)} tasks left after {count[0]} deliveries")
        return count[0]
