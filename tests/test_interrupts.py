"""An `LLM` outlives what a process does to the thread that calls it: a signal handler that
raises in the middle of a generation (Ctrl-C, a Jupyter interrupt, a ``SIGALRM`` timeout), and
``fork`` (multiprocessing's default on Linux)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

import tallow


class Alarm(Exception):
    pass


@pytest.fixture
def llm(smollm2_path: Path) -> Iterator[tallow.LLM]:
    with tallow.LLM(smollm2_path, n_ctx=256) as llm:
        yield llm


@pytest.fixture
def alarm_raises() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Alarm

    old = signal.signal(signal.SIGALRM, handler)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _usable(llm: tallow.LLM) -> None:
    """Nothing of the interrupted request holds pages, and the LLM generates as before."""
    assert llm.stats()["pages_used"] == 0, llm.stats()
    out = llm.generate("The capital of France is", max_tokens=6, temperature=0)
    assert out.completion_tokens == 6 or out.finish_reason == "stop", out


@pytest.mark.usefixtures("alarm_raises")
def test_an_exception_from_a_signal_handler_aborts_only_that_generation(
    llm: tallow.LLM,
) -> None:
    """Timers at random points of generate and stream (most land while a step computes, where
    the handler runs as the step returns to Python): the call raises the handler's exception,
    and the LLM stays usable with its pages free. (Every later call raised RuntimeError.)"""
    expected = llm.generate("The capital of France is", max_tokens=6, temperature=0).text
    rng = random.Random(7)
    interrupted = 0
    for i in range(24):
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.001, 0.08))
        try:
            if i % 2:
                llm.generate("Once upon a time", max_tokens=300, ignore_eos=True)
            else:
                for _ in llm.stream("Once upon a time", max_tokens=300, ignore_eos=True):
                    pass
        except Alarm:
            interrupted += 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        _usable(llm)
    assert interrupted >= 20
    assert llm.generate("The capital of France is", max_tokens=6, temperature=0).text == expected


def test_ctrl_c_during_generate_leaves_the_llm_usable(llm: tallow.LLM) -> None:
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate("Once upon a time", max_tokens=300, ignore_eos=True)
    timer.join()
    _usable(llm)


def _generate_in_child(llm: tallow.LLM, out: Connection) -> None:
    out.send(llm.generate("The capital of France is", max_tokens=6, temperature=0).text)


def test_a_forked_child_generates(llm: tallow.LLM) -> None:
    """The parent's compute threads are not in a child made by fork: the child makes its
    own (it hung in the thread pool)."""
    expected = llm.generate("The capital of France is", max_tokens=6, temperature=0).text
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_generate_in_child, args=(llm, send))
    child.start()
    try:
        assert receive.poll(60), "the child hung"
        assert receive.recv() == expected
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    # And the parent goes on.
    assert llm.generate("The capital of France is", max_tokens=6, temperature=0).text == expected
