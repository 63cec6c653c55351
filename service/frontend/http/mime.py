"""Binary tensors announced in the Content-Type instead of `Inference-Header-Content-Length`.

SageMaker and Vertex AI cannot pass Triton's header through, so their endpoints take the JSON header's length
from a MIME type `<prefix>N` (Triton: `application/vnd.sagemaker-triton.binary+json;json-header-size=N` and the
`vertex-ai` one). `announce_header_length` turns that into the header the HTTP front end's infer handler reads;
`mime_response` turns its binary answer back into the MIME form.
"""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from service.errors import invalid_arg
from service.frontend.http.codec import INFER_HEADER
from service.frontend.http.message import Request, Response


def announce_header_length(request: Request, prefix: str) -> None:
    """Set the request's `Inference-Header-Content-Length` from a `<prefix>N` Content-Type (dropped without one:
    the whole body is then JSON, as Triton reads it). Raises INVALID_ARG with Triton's messages."""
    headers = CIMultiDict(request.headers)
    headers.popall(INFER_HEADER, None)
    content_type = request.headers.get("Content-Type", "")
    pos = content_type.find(prefix)
    if pos > 0:
        raise invalid_arg(f"expect MIME type for binary data starts with '{prefix}', got: {content_type}")
    if pos == 0:
        text = content_type[len(prefix) :]
        digits = text.strip()
        try:
            value = int(digits.split(";", 1)[0])
        except ValueError:
            raise invalid_arg(f"Unable to parse inference header size, got: {text}") from None
        length = request.headers.get("Content-Length", "")
        body_length = int(length) if length.isdigit() else None  # chunked: the infer handler checks the range
        if value < 0 or (body_length is not None and value > body_length):
            raise invalid_arg(f"inference header size should be in range (0, {body_length}), got: {text}")
        headers[INFER_HEADER] = str(value)
    request.headers = CIMultiDictProxy(headers)


def mime_response(response: Response, prefix: str) -> Response:
    """A binary infer answer (`Inference-Header-Content-Length: N`) as Content-Type `<prefix>N`."""
    length = response.headers.pop(INFER_HEADER, None)
    if length is not None:
        response.content_type = prefix + length
    return response
