from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_STATUS_UNSPECIFIED: _ClassVar[UpdateStatus]
    APPLIED: _ClassVar[UpdateStatus]
    DUPLICATE: _ClassVar[UpdateStatus]
    BUFFERED: _ClassVar[UpdateStatus]
    CONFLICT: _ClassVar[UpdateStatus]
    UNKNOWN_GROUP: _ClassVar[UpdateStatus]
UPDATE_STATUS_UNSPECIFIED: UpdateStatus
APPLIED: UpdateStatus
DUPLICATE: UpdateStatus
BUFFERED: UpdateStatus
CONFLICT: UpdateStatus
UNKNOWN_GROUP: UpdateStatus

class RegisterGroupRequest(_message.Message):
    __slots__ = ("group_id", "ttl_seconds", "resume")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    ttl_seconds: float
    resume: bool
    def __init__(self, group_id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., resume: _Optional[bool] = ...) -> None: ...

class RegisterGroupResponse(_message.Message):
    __slots__ = ("max_depth", "sync_lane_port")
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SYNC_LANE_PORT_FIELD_NUMBER: _ClassVar[int]
    max_depth: int
    sync_lane_port: int
    def __init__(self, max_depth: _Optional[int] = ..., sync_lane_port: _Optional[int] = ...) -> None: ...

class RegisterGroupsRequest(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[RegisterGroupRequest]
    def __init__(self, groups: _Optional[_Iterable[_Union[RegisterGroupRequest, _Mapping]]] = ...) -> None: ...

class RegisterGroupsResponse(_message.Message):
    __slots__ = ("max_depth", "sync_lane_port", "status", "error")
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SYNC_LANE_PORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    max_depth: int
    sync_lane_port: int
    status: _containers.RepeatedScalarFieldContainer[int]
    error: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_depth: _Optional[int] = ..., sync_lane_port: _Optional[int] = ..., status: _Optional[_Iterable[int]] = ..., error: _Optional[_Iterable[str]] = ...) -> None: ...

class FinishGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class FinishGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CstUpdate(_message.Message):
    __slots__ = ("group_id", "request_id", "prev_token_count", "new_tokens")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREV_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    request_id: str
    prev_token_count: int
    new_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group_id: _Optional[str] = ..., request_id: _Optional[str] = ..., prev_token_count: _Optional[int] = ..., new_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class UpdateCstRequest(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[CstUpdate]
    def __init__(self, updates: _Optional[_Iterable[_Union[CstUpdate, _Mapping]]] = ...) -> None: ...

class UpdateResult(_message.Message):
    __slots__ = ("status", "committed_token_count")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    status: UpdateStatus
    committed_token_count: int
    def __init__(self, status: _Optional[_Union[UpdateStatus, str]] = ..., committed_token_count: _Optional[int] = ...) -> None: ...

class UpdateCstResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[UpdateResult]
    def __init__(self, results: _Optional[_Iterable[_Union[UpdateResult, _Mapping]]] = ...) -> None: ...

class CacheState(_message.Message):
    __slots__ = ("group_id", "log_offset")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    log_offset: int
    def __init__(self, group_id: _Optional[str] = ..., log_offset: _Optional[int] = ...) -> None: ...

class FetchCstRequest(_message.Message):
    __slots__ = ("caches", "max_tokens")
    CACHES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    caches: _containers.RepeatedCompositeFieldContainer[CacheState]
    max_tokens: int
    def __init__(self, caches: _Optional[_Iterable[_Union[CacheState, _Mapping]]] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("request_id", "start", "tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., start: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupIncrement(_message.Message):
    __slots__ = ("group_id", "max_depth", "start", "next", "segments", "more")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    max_depth: int
    start: int
    next: int
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    more: bool
    def __init__(self, group_id: _Optional[str] = ..., max_depth: _Optional[int] = ..., start: _Optional[int] = ..., next: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class FetchCstResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupIncrement]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupIncrement, _Mapping]]] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("group_ids", "request_ids", "append_group", "append_prev", "append_len", "tokens", "fetch_group", "fetch_cursor", "fetch_known", "max_tokens")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    APPEND_GROUP_FIELD_NUMBER: _ClassVar[int]
    APPEND_PREV_FIELD_NUMBER: _ClassVar[int]
    APPEND_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FETCH_GROUP_FIELD_NUMBER: _ClassVar[int]
    FETCH_CURSOR_FIELD_NUMBER: _ClassVar[int]
    FETCH_KNOWN_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    append_group: _containers.RepeatedScalarFieldContainer[int]
    append_prev: _containers.RepeatedScalarFieldContainer[int]
    append_len: _containers.RepeatedScalarFieldContainer[int]
    tokens: bytes
    fetch_group: _containers.RepeatedScalarFieldContainer[int]
    fetch_cursor: _containers.RepeatedScalarFieldContainer[int]
    fetch_known: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., request_ids: _Optional[_Iterable[str]] = ..., append_group: _Optional[_Iterable[int]] = ..., append_prev: _Optional[_Iterable[int]] = ..., append_len: _Optional[_Iterable[int]] = ..., tokens: _Optional[bytes] = ..., fetch_group: _Optional[_Iterable[int]] = ..., fetch_cursor: _Optional[_Iterable[int]] = ..., fetch_known: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("append_status", "committed", "fetch_next", "fetch_segments", "fetch_new_requests", "request_ids", "segments", "tokens", "more", "unknown_groups", "ended_groups")
    APPEND_STATUS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    FETCH_NEXT_FIELD_NUMBER: _ClassVar[int]
    FETCH_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    FETCH_NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ENDED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    append_status: bytes
    committed: _containers.RepeatedScalarFieldContainer[int]
    fetch_next: _containers.RepeatedScalarFieldContainer[int]
    fetch_segments: _containers.RepeatedScalarFieldContainer[int]
    fetch_new_requests: _containers.RepeatedScalarFieldContainer[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    segments: bytes
    tokens: bytes
    more: _containers.RepeatedScalarFieldContainer[int]
    unknown_groups: _containers.RepeatedScalarFieldContainer[int]
    ended_groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, append_status: _Optional[bytes] = ..., committed: _Optional[_Iterable[int]] = ..., fetch_next: _Optional[_Iterable[int]] = ..., fetch_segments: _Optional[_Iterable[int]] = ..., fetch_new_requests: _Optional[_Iterable[int]] = ..., request_ids: _Optional[_Iterable[str]] = ..., segments: _Optional[bytes] = ..., tokens: _Optional[bytes] = ..., more: _Optional[_Iterable[int]] = ..., unknown_groups: _Optional[_Iterable[int]] = ..., ended_groups: _Optional[_Iterable[int]] = ...) -> None: ...

class DraftParams(_message.Message):
    __slots__ = ("max_spec_tokens", "pattern_lookup_min", "pattern_lookup_max", "top_k", "min_token_prob")
    MAX_SPEC_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PATTERN_LOOKUP_MIN_FIELD_NUMBER: _ClassVar[int]
    PATTERN_LOOKUP_MAX_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKEN_PROB_FIELD_NUMBER: _ClassVar[int]
    max_spec_tokens: int
    pattern_lookup_min: int
    pattern_lookup_max: int
    top_k: int
    min_token_prob: float
    def __init__(self, max_spec_tokens: _Optional[int] = ..., pattern_lookup_min: _Optional[int] = ..., pattern_lookup_max: _Optional[int] = ..., top_k: _Optional[int] = ..., min_token_prob: _Optional[float] = ...) -> None: ...

class SpeculateRow(_message.Message):
    __slots__ = ("request_id", "group_id", "context", "params")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    group_id: str
    context: _containers.RepeatedScalarFieldContainer[int]
    params: DraftParams
    def __init__(self, request_id: _Optional[str] = ..., group_id: _Optional[str] = ..., context: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[DraftParams, _Mapping]] = ...) -> None: ...

class BatchSpeculateRequest(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[SpeculateRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[SpeculateRow, _Mapping]]] = ...) -> None: ...

class DraftPath(_message.Message):
    __slots__ = ("tokens", "probs")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class RowDraft(_message.Message):
    __slots__ = ("request_id", "paths", "match_len")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    MATCH_LEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    paths: _containers.RepeatedCompositeFieldContainer[DraftPath]
    match_len: int
    def __init__(self, request_id: _Optional[str] = ..., paths: _Optional[_Iterable[_Union[DraftPath, _Mapping]]] = ..., match_len: _Optional[int] = ...) -> None: ...

class BatchSpeculateResponse(_message.Message):
    __slots__ = ("drafts",)
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    drafts: _containers.RepeatedCompositeFieldContainer[RowDraft]
    def __init__(self, drafts: _Optional[_Iterable[_Union[RowDraft, _Mapping]]] = ...) -> None: ...

class GetMetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RpcMetrics(_message.Message):
    __slots__ = ("method", "calls", "errors", "rate_per_s", "p50_ms", "p99_ms", "total_p50_ms", "total_p99_ms", "max_ms")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_P50_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_P99_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    method: str
    calls: int
    errors: int
    rate_per_s: float
    p50_ms: float
    p99_ms: float
    total_p50_ms: float
    total_p99_ms: float
    max_ms: float
    def __init__(self, method: _Optional[str] = ..., calls: _Optional[int] = ..., errors: _Optional[int] = ..., rate_per_s: _Optional[float] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., total_p50_ms: _Optional[float] = ..., total_p99_ms: _Optional[float] = ..., max_ms: _Optional[float] = ...) -> None: ...

class GetMetricsResponse(_message.Message):
    __slots__ = ("groups", "requests", "tokens", "nodes", "approx_bytes", "expired_groups_total", "uptime_s", "rpcs")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    APPROX_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_GROUPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    RPCS_FIELD_NUMBER: _ClassVar[int]
    groups: int
    requests: int
    tokens: int
    nodes: int
    approx_bytes: int
    expired_groups_total: int
    uptime_s: float
    rpcs: _containers.RepeatedCompositeFieldContainer[RpcMetrics]
    def __init__(self, groups: _Optional[int] = ..., requests: _Optional[int] = ..., tokens: _Optional[int] = ..., nodes: _Optional[int] = ..., approx_bytes: _Optional[int] = ..., expired_groups_total: _Optional[int] = ..., uptime_s: _Optional[float] = ..., rpcs: _Optional[_Iterable[_Union[RpcMetrics, _Mapping]]] = ...) -> None: ...
