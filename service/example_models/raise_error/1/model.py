"""A model whose execute raises when INPUT0 holds a negative number, and returns a TritonError for NaN."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if np.isnan(data).any():
                error = pb_utils.TritonError("input contains NaN", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if (data < 0).any():
                raise ValueError("negative input is not allowed")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
