"""Client library for the radixd gRPC daemon (needs only grpcio and protobuf).

`Client` (blocking) and `AsyncClient` (asyncio) cover generation, sessions and forks, and every cache
admin call; `radixctl` is the command line over them. Generated stubs live in `radixd_client._pb`.
"""

from radixd_client.aio import AsyncClient, AsyncGenerationStream, AsyncSession
from radixd_client.client import Client, GenerationStream, Session
from radixd_client.types import Chunk, Completion, End, Event, SamplingOptions, Start, collect

__all__ = [
    "AsyncClient",
    "AsyncGenerationStream",
    "AsyncSession",
    "Chunk",
    "Client",
    "Completion",
    "End",
    "Event",
    "GenerationStream",
    "SamplingOptions",
    "Session",
    "Start",
    "collect",
]
