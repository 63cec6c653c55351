"""Plain descriptions of registered regions: status rows and resolved tensor references (picklable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RegionKind = Literal["system", "cuda"]


@dataclass(frozen=True, slots=True)
class SystemRegionInfo:
    """Status row of a registered system region (offset/byte_size as registered)."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class CudaRegionInfo:
    """Status row of a registered CUDA region."""

    name: str
    device_id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ResolvedRegion:
    """Where a tensor's bytes live, with everything another process needs to map them itself.

    name: registered region name. kind: "system" or "cuda". key: POSIX key (system; "" for CUDA).
    offset: absolute byte offset inside the POSIX segment (registration offset + tensor offset) or inside
    the CUDA allocation. byte_size: bytes of the tensor. device_id: CUDA device (-1 for system).
    raw_handle: 64-byte cudaIpcMemHandle_t (b"" for system). region_id: identifies this registration in
    the registry that resolved it (a later registration under the same name gets a new id).
    """

    name: str
    kind: RegionKind
    key: str
    offset: int
    byte_size: int
    device_id: int
    raw_handle: bytes
    region_id: int
    # system: a path that opens the very object registered, even once its key is unlinked or reused
    # (/proc/<server pid>/fd/<the descriptor the registry keeps>); "" when there is none
    path: str = ""
