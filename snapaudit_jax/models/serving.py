"""Serve a model locally for the server backend: a Hugging Face folder of an embedded model, ``transformers serve``.

:func:`write_hf_folder` writes the embedded SmolLM2 (or any Llama GGUF file) as a Hugging Face folder that a
serving engine loads (``transformers serve DIR``, ``vllm serve DIR``): transformers' GGUF loader dequantises
the file to float32, a ``LlamaForCausalLM`` of that config takes its state dict and is saved with the
tokenizer (``transformers serve`` cannot serve the GGUF file itself: its config names no architecture).
:class:`TransformersServe` runs ``transformers serve`` on loopback on a free port, waits for ``/health`` and
always stops it. Both need the optional packages torch and ``transformers[serving]`` (the test extra).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

from snapaudit_jax.utils.errors import DependencyError, ServerError

__all__ = ["TransformersServe", "serving_available", "write_hf_folder"]


def serving_available() -> str | None:
    """Why ``transformers serve`` cannot run here, or ``None`` when it can.

    Returns:
      A reason (a missing package or command), or ``None``.
    """
    try:
        import fastapi  # noqa: F401
        import torch  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        return f"transformers[serving] and torch are not installed ({err})"
    if not shutil.which("transformers", path=os.path.dirname(sys.executable)):
        return "the transformers command is not installed next to this Python"
    return None


def write_hf_folder(dst: str, model: str = "smollm2") -> str:
    """Writes a Llama GGUF model (default: the embedded SmolLM2) as a float32 Hugging Face folder.

    Args:
      dst: the folder to write (created; its files are overwritten).
      model: ``"smollm2"`` or a ``.gguf`` file.

    Returns:
      ``dst``.

    Raises:
      DependencyError: torch or transformers is not installed.
      CheckpointError: the model file is missing.
    """
    try:
        import torch
        import transformers
    except ImportError as err:
        raise DependencyError(f"writing a Hugging Face folder needs torch and transformers ({err})") from None
    from snapaudit_jax.models import default_model_path

    path = default_model_path(model) if model == "smollm2" else os.fspath(model)
    src, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    fresh = transformers.LlamaForCausalLM(loaded.config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.save_pretrained(dst, safe_serialization=True)
    tokenizer.save_pretrained(dst)
    return dst


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TransformersServe:
    """``transformers serve FOLDER`` on ``127.0.0.1`` (a context manager; offline: nothing is downloaded).

    Args:
      folder: the Hugging Face folder to serve; its path is the served model's id.
      startup_s: seconds to wait for ``/health``.
      log_path: the server's output (default: ``serve-PORT.log`` beside ``folder``).

    Attributes:
      folder: the folder.
      port: the port it listens on.
      log_path: its output file.
    """

    def __init__(self, folder: str, *, startup_s: float = 180.0, log_path: str | None = None):
        """Chooses a free port (the server starts on ``__enter__``).

        Args:
          folder: see :class:`TransformersServe`.
          startup_s: see :class:`TransformersServe`.
          log_path: see :class:`TransformersServe`.
        """
        self.folder = os.path.abspath(folder)
        self.startup_s = startup_s
        self.port = _free_port()
        self.log_path = log_path or os.path.join(os.path.dirname(self.folder), f"serve-{self.port}.log")
        self._proc = None
        self._log = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_id(self) -> str:
        """The id ``/v1/models`` lists: the folder's path."""
        return self.folder

    def __enter__(self) -> TransformersServe:
        reason = serving_available()
        if reason:
            raise DependencyError(f"transformers serve cannot run: {reason}")
        exe = shutil.which("transformers", path=os.path.dirname(sys.executable))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self._log = open(self.log_path, "w")
        self._proc = subprocess.Popen([exe, "serve", self.folder, "--host", "127.0.0.1", "--port", str(self.port)],
                                      stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_s
        try:
            while True:
                if self._proc.poll() is not None:
                    with open(self.log_path) as fh:
                        raise ServerError(f"transformers serve exited with {self._proc.returncode}: "
                                          f"{fh.read()[-2000:]}")
                try:
                    with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            return self
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(f"transformers serve did not answer /health within {self.startup_s:.0f} s "
                                      f"(log: {self.log_path})")
                time.sleep(0.5)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
