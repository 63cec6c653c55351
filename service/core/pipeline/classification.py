"""Triton's classification extension: replace an output by its top-k "value:index[:label]" strings."""

from __future__ import annotations

import os

import numpy as np

from service.types import OutputTensor
from shm.tensor import raw_to_numpy, serialize_bytes


def load_labels(model_dir: str, label_filename: str) -> list[str]:
    """Labels of an output, one per line of <model_dir>/<label_filename> ([] when there is no file)."""
    if not label_filename:
        return []
    try:
        with open(os.path.join(model_dir, label_filename), encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except OSError:
        return []


def classify(output: OutputTensor, k: int, labels: list[str], batched: bool) -> OutputTensor:
    """Top-k entries of each batch item (or of the whole tensor without batching), as a BYTES tensor."""
    if output.data is None:
        raise ValueError(f"output '{output.name}' has no data to classify")
    if output.datatype == "BYTES":
        raise ValueError(f"classification is not supported for BYTES output '{output.name}'")
    values = raw_to_numpy(output.data, output.datatype, output.shape).astype(np.float64)
    rows = values.reshape(values.shape[0], -1) if batched and values.ndim else values.reshape(1, -1)
    count = min(k, rows.shape[1])
    strings: list[str] = []
    for row in rows:
        # stable sort on the negated values: ties keep the lower index first, as Triton does
        for index in np.argsort(-row, kind="stable")[:count]:
            text = f"{row[index]:f}:{int(index)}"
            if int(index) < len(labels):
                text += f":{labels[int(index)]}"
            strings.append(text)
    shape = [rows.shape[0], count] if batched else [count]
    return OutputTensor(output.name, "BYTES", shape, serialize_bytes(strings))
