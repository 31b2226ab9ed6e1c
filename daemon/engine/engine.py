"""`Engine`: runs an `EngineCore` step loop on one dedicated thread, fed by a thread-safe command queue.

NOTE: the engine thread alone owns radix state and nothing takes locks: no other thread may touch
`EngineCore` once `start()` ran. Work runs guarded (an error fails only what it touched); if the thread
dies anyway, everything in flight fails and `on_fatal` tells the owner, which must stop serving."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from radixd.daemon.engine.commands import Abort, Command, Flush, Submit
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import FlushMode, GenerateRequest, Sink
from radixd.daemon.errors import EngineStopped, InvalidRequest, QueueFull
from radixd.daemon.process.host import HeapReleaser
from radixd.kernels.native import release_openmp_workers

T = TypeVar("T")

log = structlog.get_logger("radixd.engine")

# A queued command and its caller's future (None: `Submit` / `Abort`); None alone stops the thread.
_Queued = tuple[Command[Any], "concurrent.futures.Future[Any] | None"] | None


class Engine:
    """Thread wrapper around `EngineCore` with the API the server uses (see the package docstring)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._queue: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._inflight = 0  # submitted and not yet finished; guarded by _lock
        self._accepting = False
        self._stopped = threading.Event()
        # Called once, on the dying engine thread, with the error that killed it (see the module NOTE).
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.fatal_error: BaseException | None = None
        self.heap = HeapReleaser()
        # Called on the engine thread where the outputs emitted so far should leave (module docstring).
        self.handover: Callable[[], None] | None = None
        core.requests.on_request_done = self._request_done
        core.before_forward = self._handover

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (once)."""
        if self._thread is not None:
            raise RuntimeError("Engine.start() was already called")
        self._accepting = True
        # From here the engine thread computes; this thread's OpenMP workers would only sleep.
        release_openmp_workers()
        self._thread = threading.Thread(target=self._run, name="radixd-engine", daemon=True)
        self._thread.start()
        log.info("engine.started", num_blocks=self.core.kv.num_blocks, block_size=self.core.block_size)

    def shutdown(self, drain_timeout_s: float) -> None:
        """Refuse new work, let requests finish for `drain_timeout_s`, abort the rest, stop. Idempotent."""
        with self._lock:
            self._accepting = False
        thread = self._thread
        if thread is None or self._stopped.is_set():
            return
        deadline = time.monotonic() + max(0.0, drain_timeout_s)
        while time.monotonic() < deadline:
            with self._lock:
                if self._inflight == 0:
                    break
            time.sleep(0.01)
        self._queue.put(None)
        thread.join()
        log.info("engine.stopped")

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopped.is_set()

    # ---- thread-safe API -------------------------------------------------------------------------
    def submit(self, req: GenerateRequest, sink: Sink) -> None:
        """Queue a request; outputs go to `sink` on the engine thread. Thread-safe; stateless checks raise."""
        self.core.validator.validate(req)
        with self._lock:
            if not self._accepting or self._stopped.is_set():
                raise EngineStopped("the engine is draining or stopped; it accepts no new requests")
            if self._inflight >= self.core.config.max_waiting:
                raise QueueFull(
                    f"{self._inflight} requests are in flight (max_waiting={self.core.config.max_waiting});"
                    " retry later"
                )
            self._inflight += 1
            # NOTE: queued under the lock the stopping thread takes before answering what is left,
            # so no command can land after that and wait forever.
            self._queue.put((Submit(req, sink), None))

    def abort(self, request_id: str) -> None:
        """Abort a request by id: idempotent, also before it was admitted. Thread-safe."""
        self._queue.put((Abort(request_id), None))

    def execute(self, cmd: Command[T]) -> concurrent.futures.Future[T]:
        """Apply a command (commands.py) on the engine thread between steps; -> its future. Thread-safe."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        # Checked at run time too: a caller without type checking may pass anything.
        if not isinstance(cmd, Command):
            fut.set_exception(  # type: ignore[unreachable]
                InvalidRequest(f"engine.execute takes an engine command (commands.py), got {cmd!r}")
            )
            return fut
        if isinstance(cmd, Submit):  # a request is checked and counted on its way in
            fut.set_exception(InvalidRequest("queue a request with Engine.submit, not execute"))
            return fut
        self._enqueue(cmd, fut)
        return fut

    def flush(
        self, mode: FlushMode = "evict_unlocked", timeout_s: float = 30.0
    ) -> concurrent.futures.Future[int]:
        """Evict every unlocked cached block in `mode` (types.FlushMode); the future -> blocks freed."""
        return self.execute(Flush(mode, timeout_s))

    def _enqueue(self, cmd: Command[Any], fut: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            if self._thread is not None and not self._stopped.is_set():
                self._queue.put((cmd, fut))
                return
        fut.set_exception(EngineStopped("the engine is not running"))

    # ---- engine thread ---------------------------------------------------------------------------
    def _request_done(self, request_id: str) -> None:
        with self._lock:
            self._inflight = max(0, self._inflight - 1)

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            progressed = False
            while True:
                # Block on the queue when idle, or briefly when the last step could not run anything
                # (waiting for memory), so a stalled engine does not spin.
                if not self._drain(block=not (self.core.has_work() and progressed)):
                    break
                if self.core.has_work():
                    progressed = self.core.step_safely()
                    self.heap.busy(time.monotonic())
                else:
                    progressed = False
                    self.heap.idle(time.monotonic())
                self._tick()
        except BaseException as exc:  # past every guard: the thread is lost (see the module NOTE)
            error = exc
            log.critical("engine.thread_died", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        with self._lock:
            self._accepting = False
            self._stopped.set()
        try:
            if error is None:
                self.core.requests.abort_all("engine stopped")
            else:
                self.core.requests.fail_all(error)
        except BaseException as exc:
            log.critical("engine.stop_failed", exc_info=exc)
            error = error or exc
        self._fail_pending()
        self._handover()
        if error is not None:
            self._die(error)

    def _die(self, error: BaseException) -> None:
        self.fatal_error = error
        hook = self.on_fatal
        if hook is None:
            log.critical("engine.dead", hint="no on_fatal hook is set: nothing stops the process")
            return
        try:
            hook(error)
        except Exception:
            log.exception("engine.on_fatal_failed")

    def _handover(self) -> None:
        """Send the outputs emitted so far on (guarded: a failing handover is logged, the loop goes on)."""
        hook = self.handover
        if hook is None:
            return
        try:
            hook()
        except Exception:
            self.core.errors += 1
            log.exception("engine.handover_failed")

    def _tick(self) -> None:
        """Timers, guarded: a failing one is logged and retried next pass."""
        try:
            self.core.tick()
        except Exception:
            self.core.errors += 1
            log.exception("engine.tick_failed")

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; False once a stop command arrived."""
        timeout = self.core.idle_wait_s() if block else None
        if block:  # nothing runs until a command comes: what was emitted leaves now
            self._handover()
        while True:
            try:
                item = self._queue.get(timeout=timeout) if timeout is not None else self._queue.get_nowait()
            except queue.Empty:
                return True
            timeout = None  # after the first command, only take what is already queued
            if item is None:
                return False
            self.core.apply(*item)

    def _fail_pending(self) -> None:
        """After stop: answer whatever is still queued so no caller waits forever."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                continue
            cmd, fut = item
            stopped = EngineStopped("the engine stopped before running this; retry on a live daemon")
            try:
                if isinstance(cmd, Submit):
                    self.core.requests.reject(cmd.req, cmd.sink, stopped)
                elif fut is not None and fut.set_running_or_notify_cancel():
                    fut.set_exception(stopped)
            except Exception:
                log.exception("engine.refuse_failed", command=type(cmd).__name__)
