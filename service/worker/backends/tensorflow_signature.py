"""SavedModel signatures for the TensorFlow backend: read them, pick one by Triton's rules, auto-complete a config.

Pure helpers: the caller passes the imported `tensorflow` module, so this file imports nothing heavy itself.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from service.worker.backends.base import DEFAULT_MAX_BATCH_SIZE, BackendError

log = logging.getLogger("trireme.worker.tensorflow")

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAG = "serve"
SPECIAL_SIGNATURES = ("__saved_model_init_op", "__saved_model_train_op")
# Triton's --backend-config=tensorflow,default-max-batch-size default: what auto-complete gives a batching model
# tf.DType.name -> config data type (the types Triton's TensorFlow backend moves)
TF_TYPES: dict[str, str] = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "string": "TYPE_STRING",
}
TensorInfo = tuple[str, list[int] | None]  # (config data type, shape with -1 for unknown dims; None = unknown rank)


def config_type(tf: Any, dtype: Any) -> str:
    """The config data type of a TF dtype (or DataType enum value)."""
    name = tf.as_dtype(dtype).name
    return TF_TYPES.get(name, f"unsupported {name}")


def tensor_info(tf: Any, dtype: Any, shape: Any) -> TensorInfo:
    """(config data type, dims) of a graph tensor's dtype and TensorShape."""
    dims = None if shape.rank is None else [-1 if d is None else int(d) for d in shape.as_list()]
    return config_type(tf, dtype), dims


# ---- SavedModel signatures (load and auto-complete share them) --------------------------------------------
def read_meta_graph(tf: Any, path: str, tag: str, model: str) -> Any:
    """The MetaGraphDef with `tag` from <path>/saved_model.pb (or .pbtxt), parsed without loading variables."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        if os.path.isfile(os.path.join(path, "saved_model.pb")):
            with open(os.path.join(path, "saved_model.pb"), "rb") as f:
                saved.ParseFromString(f.read())
        else:
            with open(os.path.join(path, "saved_model.pbtxt"), encoding="utf-8") as f:
                text_format.Parse(f.read(), saved)
    except Exception as e:
        raise BackendError(f"unable to load model '{model}': '{path}' is not a readable SavedModel: {e}") from None
    for meta in saved.meta_graphs:
        if tag in meta.meta_info_def.tags:
            return meta
    found = sorted({t for meta in saved.meta_graphs for t in meta.meta_info_def.tags})
    raise BackendError(f"unable to load model '{model}', expected '{tag}' tag (the SavedModel has: {found})")


def pick_signature(meta: Any, wanted: str, model: str) -> tuple[str, Any]:
    """Triton's rule: the named signature (default serving_default); without one named in the config, fall back to
    the first other signature that is not the init/train op. A TF_SIGNATURE_DEF that is absent is an error."""
    sigs = meta.signature_def
    key = wanted or DEFAULT_SIGNATURE
    if key in sigs:
        return key, sigs[key]
    usable = sorted(k for k in sigs if k not in SPECIAL_SIGNATURES)
    if not wanted and usable:
        log.warning("unable to find default serving signature '%s', using signature '%s'", key, usable[0])
        return usable[0], sigs[usable[0]]
    raise BackendError(
        f"unable to load model '{model}', expected '{key}' signature (the SavedModel has: "
        f"{', '.join(usable) or 'none'})"
    )


def signature_io(tf: Any, signature: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs, outputs) of a signature: key -> (config type, shape, tensor name in the graph), keys sorted."""

    def describe(entries: Any) -> dict[str, Any]:
        out = {}
        for key in sorted(entries):
            info = entries[key]
            shape = None if info.tensor_shape.unknown_rank else [int(d.size) for d in info.tensor_shape.dim]
            out[key] = (config_type(tf, info.dtype), shape, info.name)
        return out

    return describe(signature.inputs), describe(signature.outputs)


# ---- auto-complete ---------------------------------------------------------------------------------------
def complete_config(config: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """Triton's TensorFlow auto-complete: max_batch_size, then every input, and all (or the named) outputs."""
    name = config.get("name", "")
    config = dict(config)
    tensors = [*inputs.values(), *outputs.values()]
    batching = all(shape and shape[0] == -1 for _, shape, _ in tensors)
    max_batch_size = int(config.get("max_batch_size", 0) or 0)
    if max_batch_size > 0 and not batching:
        raise BackendError(
            f"unable to autofill for '{name}', configuration specified max-batch {max_batch_size} but model "
            "signature does not support batching"
        )
    if max_batch_size == 0 and batching:
        hints = set()
        for key, found in (("input", inputs), ("output", outputs)):
            for t in config.get(key, []):
                if t.get("dims") and t.get("name") in found and found[t["name"]][1] is not None:
                    hints.add(len(found[t["name"]][1]) == len(t["dims"]) + 1)
        if len(hints) > 1:
            raise BackendError(
                f"unable to autofill for '{name}', model tensor configurations are contradicting each other in "
                "terms of whether batching is supported"
            )
        batching = hints.pop() if hints else True
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if batching else 0
        if batching and not any(k in config for k in ("dynamic_batching", "sequence_batching")):
            config["dynamic_batching"] = {}
    config["max_batch_size"] = max_batch_size
    skip = 1 if max_batch_size > 0 else 0
    for key, found in (("input", inputs), ("output", outputs)):
        given = {t.get("name"): t for t in config.get(key, [])}
        names = list(given) if key == "output" and given else list(found)
        result = []
        for tname in names:
            t = dict(given.get(tname, {"name": tname}))
            if tname in found:
                dtype, shape, _ = found[tname]
                if shape is None or len(shape) == 0:
                    raise BackendError(
                        f"unable to autofill for '{name}': the rank of model tensor '{tname}' is 0 which is not "
                        "supported"
                    )
                t.setdefault("data_type", dtype)
                if not t.get("dims"):
                    t["dims"] = shape[skip:] or [1]
                    if not shape[skip:]:
                        t["reshape"] = {"shape": []}
            result.append(t)
        config[key] = result + [t for n, t in given.items() if n not in names]
    return config
