from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FlushMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLUSH_MODE_UNSPECIFIED: _ClassVar[FlushMode]
    FLUSH_MODE_EVICT_UNLOCKED: _ClassVar[FlushMode]
    FLUSH_MODE_REFUSE_IF_BUSY: _ClassVar[FlushMode]
    FLUSH_MODE_WAIT_FOR_IDLE: _ClassVar[FlushMode]

class CacheEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_EVENT_KIND_UNSPECIFIED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_STORED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_REMOVED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_CLEARED: _ClassVar[CacheEventKind]
FLUSH_MODE_UNSPECIFIED: FlushMode
FLUSH_MODE_EVICT_UNLOCKED: FlushMode
FLUSH_MODE_REFUSE_IF_BUSY: FlushMode
FLUSH_MODE_WAIT_FOR_IDLE: FlushMode
CACHE_EVENT_KIND_UNSPECIFIED: CacheEventKind
CACHE_EVENT_KIND_STORED: CacheEventKind
CACHE_EVENT_KIND_REMOVED: CacheEventKind
CACHE_EVENT_KIND_CLEARED: CacheEventKind

class EvictRequest(_message.Message):
    __slots__ = ("num_blocks", "prefix", "session_id", "namespace")
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    prefix: _common_pb2.Prompt
    session_id: str
    namespace: str
    def __init__(self, num_blocks: _Optional[int] = ..., prefix: _Optional[_Union[_common_pb2.Prompt, _Mapping]] = ..., session_id: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("evicted_blocks",)
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    evicted_blocks: int
    def __init__(self, evicted_blocks: _Optional[int] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("mode", "timeout_s")
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    mode: FlushMode
    timeout_s: float
    def __init__(self, mode: _Optional[_Union[FlushMode, str]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("evicted_blocks",)
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    evicted_blocks: int
    def __init__(self, evicted_blocks: _Optional[int] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("prefix", "namespace")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    prefix: _common_pb2.Prompt
    namespace: str
    def __init__(self, prefix: _Optional[_Union[_common_pb2.Prompt, _Mapping]] = ..., namespace: _Optional[str] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("pinned_tokens",)
    PINNED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    pinned_tokens: int
    def __init__(self, pinned_tokens: _Optional[int] = ...) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ("prefix", "namespace")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    prefix: _common_pb2.Prompt
    namespace: str
    def __init__(self, prefix: _Optional[_Union[_common_pb2.Prompt, _Mapping]] = ..., namespace: _Optional[str] = ...) -> None: ...

class UnpinResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCacheStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCacheStatsResponse(_message.Message):
    __slots__ = ("block_size", "total_blocks", "free_blocks", "cached_blocks", "in_use_blocks", "pinned_blocks", "nodes", "hit_tokens", "miss_tokens", "evictions", "preemptions", "evictable_blocks", "kv_layout", "tree_blocks", "window_pages", "kept_windows", "kv_bytes_per_block", "window_tombstones", "kv_windows")
    class EvictionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    IN_USE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MISS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    EVICTABLE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_PAGES_FIELD_NUMBER: _ClassVar[int]
    KEPT_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    KV_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    total_blocks: int
    free_blocks: int
    cached_blocks: int
    in_use_blocks: int
    pinned_blocks: int
    nodes: int
    hit_tokens: int
    miss_tokens: int
    evictions: _containers.ScalarMap[str, int]
    preemptions: int
    evictable_blocks: int
    kv_layout: str
    tree_blocks: int
    window_pages: int
    kept_windows: int
    kv_bytes_per_block: int
    window_tombstones: int
    kv_windows: str
    def __init__(self, block_size: _Optional[int] = ..., total_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., in_use_blocks: _Optional[int] = ..., pinned_blocks: _Optional[int] = ..., nodes: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., miss_tokens: _Optional[int] = ..., evictions: _Optional[_Mapping[str, int]] = ..., preemptions: _Optional[int] = ..., evictable_blocks: _Optional[int] = ..., kv_layout: _Optional[str] = ..., tree_blocks: _Optional[int] = ..., window_pages: _Optional[int] = ..., kept_windows: _Optional[int] = ..., kv_bytes_per_block: _Optional[int] = ..., window_tombstones: _Optional[int] = ..., kv_windows: _Optional[str] = ...) -> None: ...

class LookupPrefixRequest(_message.Message):
    __slots__ = ("prompt", "namespace")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    prompt: _common_pb2.Prompt
    namespace: str
    def __init__(self, prompt: _Optional[_Union[_common_pb2.Prompt, _Mapping]] = ..., namespace: _Optional[str] = ...) -> None: ...

class LookupPrefixResponse(_message.Message):
    __slots__ = ("prompt_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("running_requests", "waiting_requests", "max_queue", "free_blocks", "total_blocks", "sessions", "draining", "swapped_requests", "drafted_tokens", "accepted_draft_tokens")
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SWAPPED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    running_requests: int
    waiting_requests: int
    max_queue: int
    free_blocks: int
    total_blocks: int
    sessions: int
    draining: bool
    swapped_requests: int
    drafted_tokens: int
    accepted_draft_tokens: int
    def __init__(self, running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., max_queue: _Optional[int] = ..., free_blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., sessions: _Optional[int] = ..., draining: _Optional[bool] = ..., swapped_requests: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class SubscribeCacheEventsRequest(_message.Message):
    __slots__ = ("after_sequence",)
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    def __init__(self, after_sequence: _Optional[int] = ...) -> None: ...

class SubscribeCacheEventsResponse(_message.Message):
    __slots__ = ("sequence", "kind", "namespace", "num_blocks", "token_ids", "timestamp", "start", "reason", "kv_group")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KV_GROUP_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kind: CacheEventKind
    namespace: str
    num_blocks: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    timestamp: float
    start: int
    reason: str
    kv_group: str
    def __init__(self, sequence: _Optional[int] = ..., kind: _Optional[_Union[CacheEventKind, str]] = ..., namespace: _Optional[str] = ..., num_blocks: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., timestamp: _Optional[float] = ..., start: _Optional[int] = ..., reason: _Optional[str] = ..., kv_group: _Optional[str] = ...) -> None: ...
