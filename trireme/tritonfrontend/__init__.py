"""Triton's `tritonfrontend` on Trireme: KServeHttp, KServeGrpc and Metrics (each with its Options) started
from Python around a trireme.tritonserver.Server; OpenAI is Trireme's own addition. `import
trireme.tritonfrontend as tritonfrontend`, or trireme.alias_triton_modules(). docs/python-api.md."""

from trireme.tritonfrontend._listeners import KServeGrpc as KServeGrpc
from trireme.tritonfrontend._listeners import KServeHttp as KServeHttp
from trireme.tritonfrontend._listeners import Metrics as Metrics
from trireme.tritonfrontend._listeners import OpenAI as OpenAI
