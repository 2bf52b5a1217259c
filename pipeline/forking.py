"""Work in a child process beside this one: the exact reference's MILP (so Ctrl-C stops it at once), the
simulated check beside the rate band, the MLflow tracker beside the search (`records.tracking.served`).

`forkable()` says whether this process may fork a child that runs Python; `Forked` runs one function there and
hands back its value; `ctrl_c_noted` turns Ctrl-C into a note where Python would drop it."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any


def forkable() -> bool:
    """Whether this process may fork a child that runs Python: fork is available, this is not a Ray worker nor itself
    a `Forked` child (a daemonic process has no children), and no thread runs beside the main one (a thread holding a
    lock when the process forks leaves it held in the child)."""
    return ("fork" in mp.get_all_start_methods() and not in_ray_worker() and not mp.current_process().daemon
            and threading.active_count() == 1)  # fmt: skip


class Forked:
    """`fn(*args, **kwargs)` started in a child process (`method`: fork, or forkserver where this process must not
    fork), to run beside this one. `result()` waits for its value (or raises its exception; Ctrl-C while starting
    it or waiting kills the child and raises KeyboardInterrupt); `kill()` stops it."""

    def __init__(self, fn: Callable[..., Any], *args: Any, method: str = "fork", **kwargs: Any) -> None:
        ctx = mp.get_context(method)
        self._recv, send = ctx.Pipe(duplex=False)
        self._child = ctx.Process(target=_child, args=(send, fn, args, kwargs), daemon=True)
        with ctrl_c_noted() as pressed:  # a Ctrl-C in the at-fork hooks would be dropped, not raised
            self._child.start()
        send.close()
        self._pressed = bool(pressed)

    def result(self, tick: Callable[[], None] | None = None, what: str = "a forked process") -> Any:
        """The child's value; `tick` is called while waiting (a progress display)."""
        with ctrl_c_noted() as pressed:
            try:
                while not self._recv.poll(0.2):
                    if pressed or self._pressed:
                        raise KeyboardInterrupt
                    if tick is not None:
                        tick()
                    if not self._child.is_alive() and not self._recv.poll(0):
                        raise RuntimeError(f"{what} died (exit code {self._child.exitcode})")
                ok, value = self._recv.recv()
            except BaseException:
                self.kill()
                raise
            finally:
                self._child.join(5)
        if pressed or self._pressed:  # as the child finished
            raise KeyboardInterrupt
        if not ok:
            raise value
        return value

    def kill(self) -> None:
        if self._child.is_alive():
            self._child.kill()
        self._child.join(5)


@contextlib.contextmanager
def ctrl_c_noted() -> Iterator[list[int]]:
    """Ctrl-C noted (an entry in the list) instead of raised, for the caller to act on.

    A KeyboardInterrupt raised where Python runs a callback (the at-fork hooks of os.fork, where
    logging releases its lock; a weakref callback during garbage collection) is printed as
    "Exception ignored" and dropped, and the search would go on solving. Off the main thread
    signal handlers cannot be set and nothing is noted."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def _child(send: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C stops
    try:
        send.send((True, fn(*args, **kwargs)))
    except Exception as err:
        send.send((False, err))


def ray_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a process that never imported Ray is not: importing it only to ask
    costs a quarter of a second)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:
        return False
