"""Pre-serialized ModelInferRequest bodies per data stream and step, inline or in shared memory.

Shared-memory placement follows perf_analyzer (`--shared-memory=system`): one region per input per
stream/step named `<input>_<stream>_<step>` and one region per output named `<output>` (tensor names
with '/' and '\\' removed), POSIX key "/" + region name, outputs sized by --output-shared-memory-size.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import posix_ipc

from load.measure.data import ConfigError, ModelInfo, Step, batched
from load.transports.client import ClientError, InferenceClient, InputTensor, RequestedOutput, build_infer_request

DEFAULT_OUTPUT_SHM_SIZE = 100 * 1024


def region_name(tensor_name: str) -> str:
    """perf_analyzer's region name for a tensor: the name without '/' and '\\'."""
    return tensor_name.replace("/", "").replace("\\", "")


class ShmSet:
    """Shared-memory regions the load generator owns: created, registered, unregistered, removed."""

    kind = "none"

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self._registered: list[InferenceClient] = []

    def create(self, name: str, size: int, data: bytes = b"") -> None:
        """Create region `name` of `size` bytes holding `data` at offset 0."""
        raise NotImplementedError

    def _register_one(self, client: InferenceClient, name: str, size: int) -> None:
        raise NotImplementedError

    def _unregister_one(self, client: InferenceClient, name: str) -> None:
        raise NotImplementedError

    def register(self, client: InferenceClient) -> None:
        """Register every region with a server (stale registrations of the same names are dropped)."""
        for name, size in self.sizes.items():
            with contextlib.suppress(ClientError):
                self._unregister_one(client, name)
            try:
                self._register_one(client, name, size)
            except ClientError as err:
                raise ConfigError(f"cannot register {self.kind} shared memory region '{name}': {err}") from None
        self._registered.append(client)

    def unregister(self, client: InferenceClient) -> None:
        """Drop every registration of these regions from one server (errors ignored: best effort)."""
        for name in self.sizes:
            with contextlib.suppress(ClientError, ValueError):
                self._unregister_one(client, name)
        if client in self._registered:
            self._registered.remove(client)

    def close(self) -> None:
        """Unregister from every server it was registered with, then release the memory."""
        for client in list(self._registered):
            self.unregister(client)


class SystemShmSet(ShmSet):
    """POSIX shared-memory regions (posix_ipc + mmap) in /dev/shm."""

    kind = "system"

    def __init__(self) -> None:
        super().__init__()
        self._maps: dict[str, tuple[posix_ipc.SharedMemory, mmap.mmap]] = {}

    def create(self, name: str, size: int, data: bytes = b"") -> None:
        key = "/" + name
        with contextlib.suppress(posix_ipc.ExistentialError):  # a leftover of a killed run
            posix_ipc.unlink_shared_memory(key)
        seg = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=max(size, 1))
        try:
            buf = mmap.mmap(seg.fd, max(size, 1))
        finally:
            seg.close_fd()
        buf[: len(data)] = data
        self._maps[name] = (seg, buf)
        self.sizes[name] = size

    def _register_one(self, client: InferenceClient, name: str, size: int) -> None:
        client.register_system_shm(name, "/" + name, size)

    def _unregister_one(self, client: InferenceClient, name: str) -> None:
        client.unregister_system_shm(name)

    def close(self) -> None:
        super().close()
        for seg, buf in self._maps.values():
            buf.close()
            with contextlib.suppress(posix_ipc.ExistentialError):
                seg.unlink()
        self._maps.clear()


class CudaShmSet(ShmSet):
    """CUDA device buffers shared through IPC handles (needs cupy and a GPU; imported lazily)."""

    kind = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        super().__init__()
        try:
            import cupy  # type: ignore[import-not-found]
        except ImportError:
            raise ConfigError("--shared-memory cuda needs the 'cupy' package and a CUDA GPU") from None
        self._cupy: Any = cupy
        self.device_id = device_id
        self._buffers: dict[str, tuple[Any, bytes]] = {}

    def create(self, name: str, size: int, data: bytes = b"") -> None:
        cp = self._cupy
        with cp.cuda.Device(self.device_id):
            mem = cp.cuda.Memory(max(size, 1))  # a whole cudaMalloc allocation, not a pool slice
            if data:
                host = np.frombuffer(data, dtype=np.uint8)
                cp.cuda.runtime.memcpy(mem.ptr, host.ctypes.data, len(data), cp.cuda.runtime.memcpyHostToDevice)
            handle = bytes(cp.cuda.runtime.ipcGetMemHandle(mem.ptr))
        self._buffers[name] = (mem, handle)
        self.sizes[name] = size

    def _register_one(self, client: InferenceClient, name: str, size: int) -> None:
        client.register_cuda_shm(name, self._buffers[name][1], self.device_id, size)

    def _unregister_one(self, client: InferenceClient, name: str) -> None:
        client.unregister_cuda_shm(name)

    def close(self) -> None:
        super().close()
        self._buffers.clear()


@dataclass
class Payloads:
    """Serialized request bodies, `streams[s][k]` for data stream s and step k, plus owned regions."""

    streams: list[list[bytes]]
    shm: ShmSet | None = None
    request_bytes: int = 0
    outputs: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Release shared-memory regions (safe to call twice)."""
        if self.shm is not None:
            self.shm.close()
            self.shm = None


def build_payloads(
    info: ModelInfo,
    streams: Sequence[Sequence[Step]],
    batch_size: int,
    shared_memory: str = "none",
    output_shm_size: int = DEFAULT_OUTPUT_SHM_SIZE,
    decoupled_stream: bool = False,
) -> Payloads:
    """Serialize one request per stream/step; with shared memory, create the regions it points to."""
    shm: ShmSet | None = None
    if shared_memory == "system":
        shm = SystemShmSet()
    elif shared_memory == "cuda":
        shm = CudaShmSet()
    elif shared_memory != "none":
        raise ConfigError(f"unknown --shared-memory '{shared_memory}' (none, system or cuda)")
    params: dict[str, bool | int | str] = {}
    if decoupled_stream:
        params["triton_enable_empty_final_response"] = True
    try:
        outputs: list[RequestedOutput] = []
        if shm is not None:
            for o in info.outputs:
                rname = region_name(o.name)
                shm.create(rname, output_shm_size)
                outputs.append(RequestedOutput(o.name, rname, output_shm_size))
        result: list[list[bytes]] = []
        for si, steps in enumerate(streams):
            bodies: list[bytes] = []
            for ki, step in enumerate(steps):
                tensors: list[InputTensor] = []
                dtypes = {t.name: t.datatype for t in info.inputs}
                for name, (shape, data) in batched(step, batch_size, info.max_batch_size).items():
                    if shm is None:
                        tensors.append(InputTensor(name, dtypes[name], shape, data=data))
                        continue
                    rname = f"{region_name(name)}_{si}_{ki}"
                    shm.create(rname, len(data), data)
                    tensors.append(InputTensor(name, dtypes[name], shape, shm_region=rname, shm_byte_size=len(data)))
                req = build_infer_request(info.name, info.version, tensors, outputs, params)
                bodies.append(req.SerializeToString())
            result.append(bodies)
    except BaseException:
        if shm is not None:
            shm.close()
        raise
    size = len(result[0][0]) if result and result[0] else 0
    return Payloads(result, shm, size, [o.name for o in info.outputs])
