"""Running one call's handler on the h2 transport as grpc.aio does: a task per call, the request(s) read from the
stream, the response(s) written, and the status the handler left (returned, aborted, raised, timed out) sent in
the trailers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from service.frontend.grpc.h2.context import EOF_MESSAGE, CallGone, H2Context

log = logging.getLogger("trireme.grpc")


class _Requests:
    """A streaming call's request messages as an async iterator (a class: mypyc compiles no async generator)."""

    def __init__(self, ctx: H2Context) -> None:
        self.ctx = ctx

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        message = await self.ctx.read()
        if message is EOF_MESSAGE:
            raise StopAsyncIteration
        return message


async def _one_request(ctx: H2Context) -> Any:
    """The single request message of a unary-request call (grpc core's errors when there are none or two)."""
    message = await ctx.read()
    if message is EOF_MESSAGE:
        await ctx.abort(grpc.StatusCode.INTERNAL, "Missing request message")  # type: ignore[arg-type]
    if await ctx.read() is not EOF_MESSAGE:
        await ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "Received a second request message for a unary call")
    return message


async def _serve(ctx: H2Context, handler: grpc.RpcMethodHandler) -> None:
    if not handler.request_streaming:
        request: Any = await _one_request(ctx)
    else:
        request = _Requests(ctx)
    if handler.request_streaming and handler.response_streaming:
        behavior = handler.stream_stream
    elif handler.request_streaming:
        behavior = handler.stream_unary
    elif handler.response_streaming:
        behavior = handler.unary_stream
    else:
        behavior = handler.unary_unary
    result = behavior(request, ctx)  # type: ignore[misc]
    if handler.response_streaming:
        if hasattr(result, "__aiter__"):
            async for response in result:
                await ctx.write(response)
        else:
            await result
    else:
        await ctx.write(await result)


async def run_call(ctx: H2Context, handler: grpc.RpcMethodHandler) -> None:
    """The call to its end; its trailers are sent unless the client reset the stream or went away."""
    status, message = grpc.StatusCode.OK, ""
    try:
        await _serve(ctx, handler)
        if ctx.status is not None:  # set_code / set_details on a call that returned
            status, message = ctx.status, ctx.message
    except grpc.aio.AbortError:
        status, message = ctx.status or grpc.StatusCode.UNKNOWN, ctx.message
    except asyncio.CancelledError:
        if ctx.conn.deadline_hit(ctx):
            status, message = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        else:
            ctx.finish(cancelled=True)
            return
    except CallGone:  # the client reset the stream or went away before the answer: nobody to answer
        ctx.finish(cancelled=True)
        return
    except Exception as e:  # grpc.aio's answer to a handler that raised
        log.exception("gRPC handler raised")
        status, message = grpc.StatusCode.UNKNOWN, f"Unexpected {type(e)}: {e}"
    ctx.conn.send_trailers(ctx, status.value[0], message)
