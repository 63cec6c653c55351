"""A small inference engine served as a Triton Python-based backend: `backend: "linear"`.

Every model of this backend keeps one file in its version folder, `model.json`:
    {"weights": [[...], ...], "bias": [...]}      (weights: n_features rows of n_outputs columns)
and answers OUTPUT = INPUT @ weights + bias (FP32, batched along the first dimension).

Start Trireme (or Triton) with `--backend-directory <dir holding linear/>`; this file is <dir>/linear/model.py.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _read_model(model_dir, version):
    with open(os.path.join(model_dir, version, "model.json"), encoding="utf-8") as f:
        spec = json.load(f)
    weights = np.asarray(spec["weights"], dtype=np.float32)
    bias = np.asarray(spec.get("bias", [0.0] * weights.shape[1]), dtype=np.float32)
    if weights.ndim != 2 or bias.shape != (weights.shape[1],):
        raise pb_utils.TritonModelException(
            f"model.json: weights must be [n_features, n_outputs] and bias [n_outputs], got "
            f"{list(weights.shape)} and {list(bias.shape)}"
        )
    return weights, bias


class TritonPythonModel:
    def initialize(self, args):
        # args["model_repository"] is the model's folder, args["model_version"] the version being loaded
        self.weights, self.bias = _read_model(args["model_repository"], args["model_version"])
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            y = (x.astype(np.float32) @ self.weights + self.bias).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, y)]))
        return responses
