"""A real OpenAI-compatible server for the tests: ``transformers serve`` on loopback, serving the embedded SmolLM2.

``transformers serve`` cannot serve the GGUF file itself (its config names no architecture), so
:func:`smollm2_folder` writes a Hugging Face folder: transformers' GGUF loader dequantises the file to float32,
a ``LlamaForCausalLM`` of that config takes its state dict and is saved with the tokenizer (offline, about
a minute on 2 cores). :class:`TransformersServe` starts the server on a free port, waits for ``/health`` and
always stops it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request


def serving_available() -> str | None:
    """Why ``transformers serve`` cannot run here (a missing extra), or ``None``."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        return f"transformers[serving] is not installed ({err})"
    if not shutil.which("transformers", path=os.path.dirname(sys.executable)):
        return "the transformers command is not next to this Python"
    return None


def smollm2_folder(dst: str) -> str:
    """Writes the embedded SmolLM2 (float32, dequantised from its GGUF) as a Hugging Face folder ``dst``."""
    import torch
    import transformers

    from snapaudit_jax.models import default_model_path

    path = default_model_path("smollm2")
    src, name = os.path.dirname(path), os.path.basename(path)
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    model = transformers.LlamaForCausalLM(loaded.config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(dst, safe_serialization=True)
    tok.save_pretrained(dst)
    return dst


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TransformersServe:
    """``with TransformersServe(folder) as srv: srv.base_url, srv.model_id``.

    Args:
      folder: the Hugging Face folder to serve (its path is the model id).
      startup_s: seconds to wait for ``/health``.
    """

    def __init__(self, folder: str, *, startup_s: float = 180.0):
        self.folder = folder
        self.startup_s = startup_s
        self.port = _free_port()
        self.proc = None
        self.log_path = os.path.join(os.path.dirname(folder), f"serve-{self.port}.log")

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_id(self) -> str:
        """The id ``/v1/models`` lists: the folder's path."""
        return self.folder

    def __enter__(self):
        exe = shutil.which("transformers", path=os.path.dirname(sys.executable))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([exe, "serve", self.folder, "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_s
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"transformers serve exited with {self.proc.returncode}: "
                                       f"{open(self.log_path).read()[-2000:]}")
                try:
                    with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            return self
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"transformers serve did not answer /health in {self.startup_s:.0f} s")
                time.sleep(0.5)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
