"""A registered system region stays the one the client registered, even when its POSIX name is re-used."""

from __future__ import annotations

import os
import uuid
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm


def _infer(client: Any, x: np.ndarray) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory("in_region", 64)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out_region", 64)
    client.infer("identity_fp32", [inp], outputs=[out])
    return x


def test_region_survives_its_name_being_reused(grpc_client: Any) -> None:
    key_in, key_out = f"/hp_in_{uuid.uuid4().hex[:8]}", f"/hp_out_{uuid.uuid4().hex[:8]}"
    h_in = shm.create_shared_memory_region("in_region", key_in, 64)
    h_out = shm.create_shared_memory_region("out_region", key_out, 64)
    other = None
    try:
        grpc_client.register_system_shared_memory("in_region", key_in, 64)
        grpc_client.register_system_shared_memory("out_region", key_out, 64)
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        shm.set_shared_memory_region(h_in, [x])
        _infer(grpc_client, x)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [1, 16]), x)
        # someone else removes the name and creates an unrelated, smaller segment under it (POSIX names are
        # machine-wide); the client's region (still mapped by the client and the server) is what counts
        os.unlink("/dev/shm" + key_in)
        other = shm.create_shared_memory_region("other", key_in, 8)
        y = x + 100
        shm.set_shared_memory_region(h_in, [y])
        _infer(grpc_client, y)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [1, 16]), y)
    finally:
        grpc_client.unregister_system_shared_memory()
        for h in (h_in, h_out, other):
            if h is not None:
                shm.destroy_shared_memory_region(h)
