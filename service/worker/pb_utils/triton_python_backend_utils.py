"""Trireme's `triton_python_backend_utils`: the API unmodified Triton Python-backend models import as pb_utils.

The worker installs this module as `sys.modules["triton_python_backend_utils"]` before importing model.py.
Behaviour follows Triton's python_backend documentation (github.com/triton-inference-server/python_backend); the
implementation is our own. This module is the public face only: each concern lives in its own module of this
package (dtypes, hooks, errors, tensor, responses, requests, lookups, control, autocomplete, metrics, batching)
and is re-exported here under the names models use. `_tensor_from_input` and `_deliver` are the worker's.
"""

from __future__ import annotations

from service.worker.pb_utils.autocomplete import ModelConfig as ModelConfig
from service.worker.pb_utils.batching import batched as batched
from service.worker.pb_utils.batching import execute_batched as execute_batched
from service.worker.pb_utils.control import Logger as Logger
from service.worker.pb_utils.control import is_model_ready as is_model_ready
from service.worker.pb_utils.control import load_model as load_model
from service.worker.pb_utils.control import unload_model as unload_model
from service.worker.pb_utils.dtypes import TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY
from service.worker.pb_utils.dtypes import TRITONSERVER_MEMORY_CPU as TRITONSERVER_MEMORY_CPU
from service.worker.pb_utils.dtypes import TRITONSERVER_MEMORY_CPU_PINNED as TRITONSERVER_MEMORY_CPU_PINNED
from service.worker.pb_utils.dtypes import TRITONSERVER_MEMORY_GPU as TRITONSERVER_MEMORY_GPU
from service.worker.pb_utils.dtypes import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END as TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
)
from service.worker.pb_utils.dtypes import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START as TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
)
from service.worker.pb_utils.dtypes import TRITONSERVER_REQUEST_RELEASE_ALL as TRITONSERVER_REQUEST_RELEASE_ALL
from service.worker.pb_utils.dtypes import (
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE as TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
)
from service.worker.pb_utils.dtypes import TRITONSERVER_RESPONSE_COMPLETE_FINAL as TRITONSERVER_RESPONSE_COMPLETE_FINAL
from service.worker.pb_utils.dtypes import deserialize_bytes_tensor as deserialize_bytes_tensor
from service.worker.pb_utils.dtypes import numpy_to_triton_type as numpy_to_triton_type
from service.worker.pb_utils.dtypes import serialize_byte_tensor as serialize_byte_tensor
from service.worker.pb_utils.dtypes import triton_string_to_numpy as triton_string_to_numpy
from service.worker.pb_utils.dtypes import triton_to_numpy_type as triton_to_numpy_type
from service.worker.pb_utils.errors import TritonError as TritonError
from service.worker.pb_utils.errors import TritonModelException as TritonModelException
from service.worker.pb_utils.hooks import get_model_dir as get_model_dir
from service.worker.pb_utils.hooks import runtime as runtime
from service.worker.pb_utils.lookups import get_input_config_by_name as get_input_config_by_name
from service.worker.pb_utils.lookups import get_input_tensor_by_name as get_input_tensor_by_name
from service.worker.pb_utils.lookups import get_output_config_by_name as get_output_config_by_name
from service.worker.pb_utils.lookups import get_output_tensor_by_name as get_output_tensor_by_name
from service.worker.pb_utils.lookups import (
    using_decoupled_model_transaction_policy as using_decoupled_model_transaction_policy,
)
from service.worker.pb_utils.metrics import COUNTER as COUNTER
from service.worker.pb_utils.metrics import GAUGE as GAUGE
from service.worker.pb_utils.metrics import HISTOGRAM as HISTOGRAM
from service.worker.pb_utils.metrics import Metric as Metric
from service.worker.pb_utils.metrics import MetricFamily as MetricFamily
from service.worker.pb_utils.requests import InferenceRequest as InferenceRequest
from service.worker.pb_utils.requests import InferenceResponseSender as InferenceResponseSender
from service.worker.pb_utils.requests import InferenceTrace as InferenceTrace
from service.worker.pb_utils.requests import PreferredMemory as PreferredMemory
from service.worker.pb_utils.requests import ResponseIterator as ResponseIterator
from service.worker.pb_utils.requests import _incoming as _incoming
from service.worker.pb_utils.responses import InferenceResponse as InferenceResponse
from service.worker.pb_utils.responses import _deliver as _deliver
from service.worker.pb_utils.tensor import Tensor as Tensor
from service.worker.pb_utils.tensor import _tensor_from_input as _tensor_from_input
