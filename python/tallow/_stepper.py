"""Engine steps that an exception raised by a signal handler cannot cut in half.

Python runs signal handlers in the main thread, between any two bytecodes: Ctrl-C (a
``KeyboardInterrupt``), a Jupyter interrupt or a ``SIGALRM`` handler that raises lands in the
middle of whatever the main thread runs. Inside an engine step (the scheduler planned it, the
batch is computed, tokens are drawn, the scheduler takes them) that leaves the scheduler
waiting for a step that never ends, and the engine unusable. So a step asked for by the main
thread runs on a thread of its own while the main thread waits for it: an interrupt ends the
wait, and the step still completes.
"""

from __future__ import annotations

import _thread
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["StepThread"]

Owner = TypeVar("Owner")


class _Job:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.error: BaseException | None = None


class StepThread(Generic[Owner]):
    """Runs ``step(owner)`` for callers in the main thread on a thread of its own (started at
    the first call, and again in a child made by ``fork``, which has only the thread that
    forked); other threads run it themselves. The thread holds ``owner`` weakly and ends when
    it goes."""

    def __init__(self, owner: Owner, step: Callable[[Owner], None]) -> None:
        self._owner = weakref.ref(owner)
        self._step = step
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._pid = 0

    def run(self) -> None:
        """One call of ``step``, finished even if the caller is interrupted while it waits;
        its exception, if it raised one, is raised here."""
        if threading.current_thread() is not threading.main_thread():
            return self._call()
        job = _Job()
        self._queue().put(job)
        job.done.acquire()
        if job.error is not None:
            raise job.error

    def stop(self) -> None:
        """End the thread (after the step it runs, if any)."""
        if self._jobs is not None and self._pid == os.getpid():
            self._jobs.put(None)
        self._jobs = None

    def _call(self) -> None:
        owner = self._owner()
        if owner is not None:
            self._step(owner)

    def _queue(self) -> queue.SimpleQueue[_Job | None]:
        if self._jobs is None or self._pid != os.getpid():
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(jobs, self._call), name="tallow-step", daemon=True
            ).start()
            owner = self._owner()
            if owner is not None:
                weakref.finalize(owner, jobs.put, None)
            self._jobs, self._pid = jobs, os.getpid()
        return self._jobs


def _serve(jobs: queue.SimpleQueue[_Job | None], call: Callable[[], None]) -> None:
    """The step thread: runs a step per job until told to stop (the owner is gone)."""
    while (job := jobs.get()) is not None:
        try:
            call()
        except BaseException as e:  # handed to the caller, whatever it is
            job.error = e
        finally:
            job.done.release()
