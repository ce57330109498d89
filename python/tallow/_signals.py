"""Engine steps that an exception raised by a signal handler cannot cut in half.

Python runs signal handlers in the main thread, between any two bytecodes: Ctrl-C (a
``KeyboardInterrupt``), a Jupyter interrupt or a ``SIGALRM`` handler that raises lands in the
middle of whatever the main thread runs. Inside an engine step (the scheduler planned it, the
batch is computed, tokens are drawn, the scheduler takes them) that leaves the scheduler
waiting for a step that never ends, and the engine unusable. :func:`held_signals` holds the
handlers back while a step runs and calls them once it is complete.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["held_signals"]

# The signals that arrive from outside at any moment (a synchronous fault is not held).
_ASYNCHRONOUS = tuple(
    int(sig)
    for name in (
        "SIGINT",
        "SIGTERM",
        "SIGHUP",
        "SIGQUIT",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGUSR1",
        "SIGUSR2",
        "SIGCHLD",
        "SIGWINCH",
        "SIGIO",
        "SIGURG",
        "SIGXCPU",
        "SIGTSTP",
        "SIGBREAK",
    )
    if (sig := getattr(signal, name, None)) is not None
)

Handler = Callable[[int, FrameType | None], object]


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """In the main thread, the Python handlers of the signals that arrive meanwhile run when
    the block ends, in the order the signals came (an exception one raises is raised there);
    in other threads, where no handler runs, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        arrived.append((signum, frame))

    handlers: dict[int, Handler] = {}
    # `_signal`'s functions are `signal`'s without the conversion of each number and handler
    # to an enum, which cost a quarter of a millisecond a step.
    try:
        for sig in _ASYNCHRONOUS:
            handler = _signal.getsignal(sig)
            if callable(handler):
                handlers[sig] = handler
                _signal.signal(sig, hold)
        yield
    finally:
        for sig, handler in handlers.items():
            _signal.signal(sig, handler)
        for signum, frame in arrived:
            handlers[signum](signum, frame)
