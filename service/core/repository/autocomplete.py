"""Config auto-complete: ask a short-lived worker to let the backend fill in the config from the model."""

from __future__ import annotations

import asyncio
import os

from protos import model_config_pb2 as mc
from service.core.repository import model_config as cfg
from service.errors import ErrorCode, ServiceError
from service.instances.envs.prepare import ExecEnv
from service.instances.spawn import worker_env
from service.ipc import frames as ipc
from service.ipc.launch import fds_env, worker_command
from service.ipc.pipes import close_ends, open_pipes, pipe_pair

AUTO_COMPLETE_TIMEOUT_S = 60.0


def needs_auto_complete(config: mc.ModelConfig, version_dir: str, backend_dir: str = "") -> bool:
    """Whether the backend has anything to contribute (skips a process start for most models)."""
    if config.backend == "python" or backend_dir:
        path = (
            os.path.join(backend_dir, "model.py")
            if backend_dir
            else os.path.join(version_dir, config.default_model_filename or "model.py")
        )
        try:
            with open(path, encoding="utf-8") as f:
                return "auto_complete_config" in f.read()
        except OSError:
            return False
    if config.platform == "tensorflow_savedmodel":  # also completes tensors given without data_type or dims
        incomplete = any(not t.data_type or not t.dims for t in config.input) or any(
            not t.data_type or not t.dims for t in config.output
        )
        return not config.input or not config.output or incomplete
    return config.backend in ("onnxruntime", "tensorrt", "pytorch", "openvino") and (
        not config.input or not config.output
    )


async def run_auto_complete(
    config: mc.ModelConfig,
    model_dir: str,
    version_dir: str,
    config_file_exists: bool,
    backend_dir: str = "",
    exec_env: ExecEnv | None = None,
) -> mc.ModelConfig:
    """The config completed by the model's backend; unchanged when the backend has nothing to add.

    `backend_dir`: the folder of the model's Python-based backend ("" for a built-in backend); `exec_env`: the
    model's execution environment (the model's imports resolve there, as its workers' do).
    """
    loop = asyncio.get_running_loop()
    if not await loop.run_in_executor(None, needs_auto_complete, config, version_dir, backend_dir):
        if not config_file_exists and config.backend == "python":
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"{os.path.join(model_dir, 'config.pbtxt')}: model configuration file is missing and model.py "
                "does not define auto_complete_config",
            )
        return config
    parent, child = pipe_pair()
    try:
        title = {"model": os.path.basename(model_dir), "version": os.path.basename(version_dir)}
        proc = await asyncio.create_subprocess_exec(
            *worker_command({**title, "task": "auto-complete"}, exec_env.python if exec_env else ""),
            pass_fds=child,
            env=worker_env({**(exec_env.env if exec_env else {}), **fds_env(list(child))}),
            stdin=asyncio.subprocess.DEVNULL,
            # own session: signals sent to the server's process group (Ctrl-C, timeout) must not
            # kill workers behind the server's back; the server stops them, or they exit on EOF
            start_new_session=True,
        )
    except BaseException:
        close_ends(parent)
        raise
    finally:
        close_ends(child)
    try:
        reader = asyncio.StreamReader()
        writer, receiver = await open_pipes(loop, parent, asyncio.StreamReaderProtocol(reader))
        try:
            writer.write(
                ipc.encode(ipc.AutoComplete(config.backend, model_dir, version_dir, cfg.to_json(config), backend_dir))
            )
            header = await asyncio.wait_for(reader.readexactly(4), AUTO_COMPLETE_TIMEOUT_S)
            (n,) = ipc.HEADER.unpack(header)
            reply = ipc.decode(await reader.readexactly(n))
        finally:
            writer.close()
            receiver.close()
    except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as e:
        raise ServiceError(ErrorCode.INTERNAL, f"auto-complete of '{model_dir}' failed: {e!r}") from None
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    if isinstance(reply, ipc.Failed):
        raise ServiceError(
            ErrorCode.INVALID_ARG,
            f"auto-complete of model '{os.path.basename(model_dir)}' failed: {reply.message}",
        )
    return cfg.from_json(reply.config_json)
