"""Draining on SIGTERM: report not ready at once, then let uvicorn stop accepting and finish the
requests and streams in flight for up to the policy's `replicas.drain_s` (its graceful-shutdown
timeout, set by `gateway serve`), then exit.

uvicorn owns SIGTERM/SIGINT (it installs its handlers before the app starts); the app chains its
own in front so `/ready` says "draining" from the first moment, including on keep-alive
connections that are still open and to probes that reach a worker before its listener closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("gateway.drain")
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drain:
    def __init__(self) -> None:
        self.since: float | None = None
        self._previous: dict[int, Any] = {}

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self, reason: str = "SIGTERM") -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s: draining (not ready; finishing requests in flight)", reason)

    def install(self) -> None:
        """Chain in front of the current handlers (uvicorn's). Main thread only; elsewhere (an
        app served from a thread, as in tests) nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            with contextlib.suppress(ValueError, OSError):
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        self.begin(signal.Signals(sig).name)
        previous = self._previous.get(sig)
        if callable(previous):
            previous(sig, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + sig)


@contextlib.contextmanager
def hup_blocked() -> Iterator[None]:
    """SIGHUP blocked in this thread meanwhile (a SIGHUP arriving then is delivered after)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def serve_workers(app: str, **options: Any) -> None:
    """`uvicorn.run` for several workers, with a supervisor that stops accepting on SIGTERM.

    uvicorn's supervisor keeps its copy of the listening socket open until every worker has
    exited, so during a drain the kernel still completes new connections that nobody will ever
    serve (they hang, then are reset). Closing the supervisor's copy first means that once the
    workers close theirs (at the start of their drain) new connections are refused at once, and
    a client or load balancer moves on to another replica.
    """
    import uvicorn
    from uvicorn.supervisors.multiprocess import Multiprocess

    class DrainingMultiprocess(Multiprocess):
        def _stop_accepting(self) -> None:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.close()

        def handle_term(self) -> None:
            self._stop_accepting()
            super().handle_term()

        def handle_int(self) -> None:
            self._stop_accepting()
            super().handle_int()

        # A worker is born with SIGHUP blocked (the mask survives fork and exec) and unblocks it
        # once its reload handler is in place (PolicyReloader.start): a SIGHUP passed on while
        # it was still importing had killed it (the default action), and now waits for it.
        def init_processes(self) -> None:
            with hup_blocked():
                super().init_processes()

        def keep_subprocess_alive(self) -> None:
            with hup_blocked():
                super().keep_subprocess_alive()

        def restart_all(self) -> None:
            with hup_blocked():
                super().restart_all()

        def handle_ttin(self) -> None:
            with hup_blocked():
                super().handle_ttin()

        def handle_hup(self) -> None:
            # SIGHUP means "reload the policy" (each worker's own handler); uvicorn's supervisor
            # would restart every worker instead, losing in-memory state and connections.
            for process in self.processes:
                with contextlib.suppress(OSError, ValueError, TypeError):
                    if process.pid is not None:
                        os.kill(process.pid, signal.SIGHUP)

    config = uvicorn.Config(app, **options)
    sock = config.bind_socket()
    DrainingMultiprocess(config, sockets=[sock]).run()
