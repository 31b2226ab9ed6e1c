from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Session(_message.Message):
    __slots__ = ("session_id", "num_tokens", "num_turns", "parent_id", "resident_tokens", "expires_in_s", "busy")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    num_tokens: int
    num_turns: int
    parent_id: str
    resident_tokens: int
    expires_in_s: float
    busy: bool
    def __init__(self, session_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., num_turns: _Optional[int] = ..., parent_id: _Optional[str] = ..., resident_tokens: _Optional[int] = ..., expires_in_s: _Optional[float] = ..., busy: _Optional[bool] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("context", "ttl_s")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    context: _common_pb2.Prompt
    ttl_s: float
    def __init__(self, context: _Optional[_Union[_common_pb2.Prompt, _Mapping]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class SessionServiceGenerateRequest(_message.Message):
    __slots__ = ("session_id", "prompt", "sampling", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt: _common_pb2.Prompt
    sampling: _common_pb2.SamplingParams
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., prompt: _Optional[_Union[_common_pb2.Prompt, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SessionServiceGenerateResponse(_message.Message):
    __slots__ = ("start", "chunk", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: _common_pb2.GenerationStart
    chunk: _common_pb2.GenerationChunk
    end: _common_pb2.GenerationEnd
    def __init__(self, start: _Optional[_Union[_common_pb2.GenerationStart, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.GenerationChunk, _Mapping]] = ..., end: _Optional[_Union[_common_pb2.GenerationEnd, _Mapping]] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("session_id", "count")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    count: int
    def __init__(self, session_id: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class ForkSessionResponse(_message.Message):
    __slots__ = ("children",)
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    children: _containers.RepeatedCompositeFieldContainer[Session]
    def __init__(self, children: _Optional[_Iterable[_Union[Session, _Mapping]]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id", "drop_cache")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DROP_CACHE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    drop_cache: bool
    def __init__(self, session_id: _Optional[str] = ..., drop_cache: _Optional[bool] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("freed_blocks",)
    FREED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    freed_blocks: int
    def __init__(self, freed_blocks: _Optional[int] = ...) -> None: ...
