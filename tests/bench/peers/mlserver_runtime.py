"""MLServer custom runtimes for the peer benchmark: identity and the shared scikit-learn model (Open Inference
Protocol, like Trireme). run.py writes the model-settings.json files; adaptive batching is MLServer's own
(max_batch_size / max_batch_time in the settings)."""

from __future__ import annotations

import numpy as np
from common import build_model
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Identity(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        data = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", data)])


class SkModel(MLModel):
    async def load(self) -> bool:
        self.model = build_model()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        rows = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        labels = self.model.predict(rows).astype(np.int64).reshape(-1, 1)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("LABEL", labels)])
