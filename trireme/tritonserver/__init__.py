"""Triton's in-process Python API (`tritonserver`) on Trireme's engine: the same names, signatures, defaults
and errors. Code written for Triton runs unchanged with `import trireme.tritonserver as tritonserver` (or after
`trireme.alias_triton_modules()`). docs/python-api.md maps every name and lists what differs."""

from service import __version__ as __version__
from trireme.tritonserver._enums import DataType as DataType
from trireme.tritonserver._enums import DLDeviceType as DLDeviceType
from trireme.tritonserver._enums import InstanceGroupKind as InstanceGroupKind
from trireme.tritonserver._enums import LogFormat as LogFormat
from trireme.tritonserver._enums import MemoryType as MemoryType
from trireme.tritonserver._enums import MetricFormat as MetricFormat
from trireme.tritonserver._enums import MetricKind as MetricKind
from trireme.tritonserver._enums import ModelBatchFlag as ModelBatchFlag
from trireme.tritonserver._enums import ModelControlMode as ModelControlMode
from trireme.tritonserver._enums import ModelTxnPropertyFlag as ModelTxnPropertyFlag
from trireme.tritonserver._enums import RateLimitMode as RateLimitMode
from trireme.tritonserver._errors import AlreadyExistsError as AlreadyExistsError
from trireme.tritonserver._errors import CancelledError as CancelledError
from trireme.tritonserver._errors import InternalError as InternalError
from trireme.tritonserver._errors import InvalidArgumentError as InvalidArgumentError
from trireme.tritonserver._errors import NotFoundError as NotFoundError
from trireme.tritonserver._errors import TritonError as TritonError
from trireme.tritonserver._errors import UnavailableError as UnavailableError
from trireme.tritonserver._errors import UnknownError as UnknownError
from trireme.tritonserver._errors import UnsupportedError as UnsupportedError
from trireme.tritonserver._model import Model as Model
from trireme.tritonserver._options import ModelLoadDeviceLimit as ModelLoadDeviceLimit
from trireme.tritonserver._options import Options as Options
from trireme.tritonserver._options import RateLimiterResource as RateLimiterResource
from trireme.tritonserver._request import InferenceRequest as InferenceRequest
from trireme.tritonserver._response import AsyncResponseIterator as AsyncResponseIterator
from trireme.tritonserver._response import InferenceResponse as InferenceResponse
from trireme.tritonserver._response import ResponseIterator as ResponseIterator
from trireme.tritonserver._server import Server as Server
from trireme.tritonserver._tensor import MemoryBuffer as MemoryBuffer
from trireme.tritonserver._tensor import Tensor as Tensor
