"""Clients of the ChatTTS Triton deployment: gRPC streaming, HTTP offline and SSE streaming.

All three take a :class:`SynthesisRequest` and return a :class:`SynthesisResult`; errors the
server reports (and transport failures) raise :class:`ClientError`. :class:`AioStreamClient`
streams from asyncio code (one shared gRPC channel per process; the OpenAI gateway uses it).
"""

from .aio import AioStreamClient
from .common import ChunkOrder, ClientError, StreamPart, SynthesisRequest, SynthesisResult, read_wav, write_wav
from .grpc_stream import iter_chunks, iter_parts, synthesize_stream
from .http_infer import synthesize_offline
from .sse import iter_sse_chunks, iter_sse_parts, synthesize_sse

__all__ = [
    "AioStreamClient",
    "ChunkOrder",
    "ClientError",
    "StreamPart",
    "SynthesisRequest",
    "SynthesisResult",
    "iter_chunks",
    "iter_parts",
    "iter_sse_chunks",
    "iter_sse_parts",
    "read_wav",
    "synthesize_offline",
    "synthesize_sse",
    "synthesize_stream",
    "write_wav",
]
