"""Clients of the ChatTTS Triton deployment: gRPC streaming, HTTP offline and SSE streaming.

All three take a :class:`SynthesisRequest` and return a :class:`SynthesisResult`; errors the
server reports (and transport failures) raise :class:`ClientError`.
"""

from .common import ClientError, StreamPart, SynthesisRequest, SynthesisResult, write_wav
from .grpc_stream import iter_chunks, iter_parts, synthesize_stream
from .http_infer import synthesize_offline
from .sse import iter_sse_chunks, iter_sse_parts, synthesize_sse

__all__ = [
    "ClientError",
    "StreamPart",
    "SynthesisRequest",
    "SynthesisResult",
    "iter_chunks",
    "iter_parts",
    "iter_sse_chunks",
    "iter_sse_parts",
    "synthesize_offline",
    "synthesize_sse",
    "synthesize_stream",
    "write_wav",
]
