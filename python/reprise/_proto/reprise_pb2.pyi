from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CODE_INTERNAL: Code
CODE_INVALID_ARGUMENT: Code
CODE_NOT_FOUND: Code
CODE_OK: Code
CODE_PARTIAL: Code
CODE_RATE_LIMITED: Code
CODE_RESOURCE_EXHAUSTED: Code
CODE_SIGNATURE_MISMATCH: Code
CODE_UNAVAILABLE: Code
COMPRESSION_NONE: Compression
COMPRESSION_S2: Compression
COMPRESSION_ZSTD: Compression
DESCRIPTOR: _descriptor.FileDescriptor
PACKED_LAYOUT_COMPACT: PackedLayout
PACKED_LAYOUT_UNIFORM: PackedLayout
PACKED_LAYOUT_WIDE: PackedLayout

class Checkpoint(_message.Message):
    __slots__ = ["applied_sequence", "chunks", "created_unix_nano", "last_sweep_unix_nano", "pending", "producers", "stream_created_unix_nano", "tables", "version"]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    LAST_SWEEP_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    STREAM_CREATED_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    applied_sequence: int
    chunks: _containers.RepeatedScalarFieldContainer[bytes]
    created_unix_nano: int
    last_sweep_unix_nano: int
    pending: _containers.RepeatedCompositeFieldContainer[PendingItem]
    producers: _containers.RepeatedCompositeFieldContainer[ProducerCheckpoint]
    stream_created_unix_nano: int
    tables: _containers.RepeatedCompositeFieldContainer[TableCheckpoint]
    version: int
    def __init__(self, version: _Optional[int] = ..., applied_sequence: _Optional[int] = ..., created_unix_nano: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableCheckpoint, _Mapping]]] = ..., chunks: _Optional[_Iterable[bytes]] = ..., producers: _Optional[_Iterable[_Union[ProducerCheckpoint, _Mapping]]] = ..., last_sweep_unix_nano: _Optional[int] = ..., pending: _Optional[_Iterable[_Union[PendingItem, _Mapping]]] = ..., stream_created_unix_nano: _Optional[int] = ...) -> None: ...

class CheckpointFile(_message.Message):
    __slots__ = ["checkpoint", "sha256"]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    checkpoint: bytes
    sha256: bytes
    def __init__(self, checkpoint: _Optional[bytes] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ["applied_sequence", "bytes", "items", "name", "pause_ns", "status", "write_ns"]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAUSE_NS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WRITE_NS_FIELD_NUMBER: _ClassVar[int]
    applied_sequence: int
    bytes: int
    items: int
    name: str
    pause_ns: int
    status: Status
    write_ns: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., name: _Optional[str] = ..., applied_sequence: _Optional[int] = ..., items: _Optional[int] = ..., bytes: _Optional[int] = ..., pause_ns: _Optional[int] = ..., write_ns: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ["compression", "data", "delta_encoded", "dtype", "episode_id", "episode_step", "key", "length", "raw_size", "step_shape"]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DELTA_ENCODED_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_STEP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    RAW_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_SHAPE_FIELD_NUMBER: _ClassVar[int]
    compression: Compression
    data: bytes
    delta_encoded: bool
    dtype: str
    episode_id: int
    episode_step: int
    key: int
    length: int
    raw_size: int
    step_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, key: _Optional[int] = ..., dtype: _Optional[str] = ..., step_shape: _Optional[_Iterable[int]] = ..., length: _Optional[int] = ..., compression: _Optional[_Union[Compression, str]] = ..., delta_encoded: bool = ..., raw_size: _Optional[int] = ..., data: _Optional[bytes] = ..., episode_id: _Optional[int] = ..., episode_step: _Optional[int] = ...) -> None: ...

class ColumnSlice(_message.Message):
    __slots__ = ["chunk_key", "length", "offset"]
    CHUNK_KEY_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    chunk_key: int
    length: int
    offset: int
    def __init__(self, chunk_key: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ColumnSpec(_message.Message):
    __slots__ = ["dtype", "name", "shape"]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class HeldMessage(_message.Message):
    __slots__ = ["data", "items_applied", "stored_at_unix_nano"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ITEMS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    items_applied: int
    stored_at_unix_nano: int
    def __init__(self, data: _Optional[bytes] = ..., stored_at_unix_nano: _Optional[int] = ..., items_applied: _Optional[int] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ["applied_sequence", "chunk_bytes", "chunks", "max_mutation_ops", "rejected_messages", "shard_count", "shard_index", "status", "tables"]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MUTATION_OPS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    applied_sequence: int
    chunk_bytes: int
    chunks: int
    max_mutation_ops: int
    rejected_messages: int
    shard_count: int
    shard_index: int
    status: Status
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ..., applied_sequence: _Optional[int] = ..., chunks: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., rejected_messages: _Optional[int] = ..., shard_index: _Optional[int] = ..., shard_count: _Optional[int] = ..., max_mutation_ops: _Optional[int] = ...) -> None: ...

class InsertBatch(_message.Message):
    __slots__ = ["chunks", "end_of_stream", "items", "notice_subject", "producer_id", "release_chunk_keys", "sequence", "window", "window_start"]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    END_OF_STREAM_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NOTICE_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_CHUNK_KEYS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    end_of_stream: bool
    items: _containers.RepeatedCompositeFieldContainer[Item]
    notice_subject: str
    producer_id: str
    release_chunk_keys: _containers.RepeatedScalarFieldContainer[int]
    sequence: int
    window: int
    window_start: int
    def __init__(self, producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ..., release_chunk_keys: _Optional[_Iterable[int]] = ..., end_of_stream: bool = ..., window_start: _Optional[int] = ..., window: _Optional[int] = ..., notice_subject: _Optional[str] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ["columns", "key", "policy_version", "priority", "table"]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[TrajectoryColumn]
    key: int
    policy_version: int
    priority: float
    table: str
    def __init__(self, key: _Optional[int] = ..., table: _Optional[str] = ..., priority: _Optional[float] = ..., columns: _Optional[_Iterable[_Union[TrajectoryColumn, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ItemCheckpoint(_message.Message):
    __slots__ = ["columns", "inserted_at_unix_nano", "key", "policy_version", "priority", "seq", "times_sampled"]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    INSERTED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[TrajectoryColumn]
    inserted_at_unix_nano: int
    key: int
    policy_version: int
    priority: float
    seq: int
    times_sampled: int
    def __init__(self, key: _Optional[int] = ..., priority: _Optional[float] = ..., times_sampled: _Optional[int] = ..., inserted_at_unix_nano: _Optional[int] = ..., seq: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[TrajectoryColumn, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ItemInfo(_message.Message):
    __slots__ = ["columns", "inserted_at_unix_nano", "key", "policy_version", "priority", "times_sampled"]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    INSERTED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[TrajectoryColumn]
    inserted_at_unix_nano: int
    key: int
    policy_version: int
    priority: float
    times_sampled: int
    def __init__(self, key: _Optional[int] = ..., priority: _Optional[float] = ..., times_sampled: _Optional[int] = ..., inserted_at_unix_nano: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[TrajectoryColumn, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ItemsRequest(_message.Message):
    __slots__ = ["keys", "limit", "offset", "table"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    offset: int
    table: str
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ItemsResponse(_message.Message):
    __slots__ = ["items", "status", "table_size"]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ItemInfo]
    status: Status
    table_size: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., items: _Optional[_Iterable[_Union[ItemInfo, _Mapping]]] = ..., table_size: _Optional[int] = ...) -> None: ...

class LimiterInfo(_message.Message):
    __slots__ = ["deletes", "inserts", "max_diff", "min_diff", "min_size", "samples", "samples_per_insert"]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    MAX_DIFF_FIELD_NUMBER: _ClassVar[int]
    MIN_DIFF_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_INSERT_FIELD_NUMBER: _ClassVar[int]
    deletes: int
    inserts: int
    max_diff: float
    min_diff: float
    min_size: int
    samples: int
    samples_per_insert: float
    def __init__(self, samples_per_insert: _Optional[float] = ..., min_size: _Optional[int] = ..., min_diff: _Optional[float] = ..., max_diff: _Optional[float] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., deletes: _Optional[int] = ...) -> None: ...

class Mutation(_message.Message):
    __slots__ = ["max_staleness", "notice_subject", "ops", "policy_version", "table"]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    NOTICE_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    max_staleness: int
    notice_subject: str
    ops: _containers.RepeatedCompositeFieldContainer[MutationOp]
    policy_version: int
    table: str
    def __init__(self, table: _Optional[str] = ..., ops: _Optional[_Iterable[_Union[MutationOp, _Mapping]]] = ..., policy_version: _Optional[int] = ..., max_staleness: _Optional[int] = ..., notice_subject: _Optional[str] = ...) -> None: ...

class MutationOp(_message.Message):
    __slots__ = ["delete", "key", "priority"]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    delete: bool
    key: int
    priority: float
    def __init__(self, key: _Optional[int] = ..., priority: _Optional[float] = ..., delete: bool = ...) -> None: ...

class PackedSamples(_message.Message):
    __slots__ = ["chunks", "columns", "compact_chunks", "compact_columns", "compact_infos", "data", "formats", "infos", "names", "slices", "uniform_columns"]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COMPACT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    COMPACT_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COMPACT_INFOS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FORMATS_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    UNIFORM_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    chunks: bytes
    columns: bytes
    compact_chunks: bytes
    compact_columns: bytes
    compact_infos: bytes
    data: bytes
    formats: _containers.RepeatedCompositeFieldContainer[StepFormat]
    infos: bytes
    names: _containers.RepeatedScalarFieldContainer[str]
    slices: bytes
    uniform_columns: bytes
    def __init__(self, infos: _Optional[bytes] = ..., columns: _Optional[bytes] = ..., names: _Optional[_Iterable[str]] = ..., slices: _Optional[bytes] = ..., chunks: _Optional[bytes] = ..., formats: _Optional[_Iterable[_Union[StepFormat, _Mapping]]] = ..., data: _Optional[bytes] = ..., compact_infos: _Optional[bytes] = ..., compact_columns: _Optional[bytes] = ..., compact_chunks: _Optional[bytes] = ..., uniform_columns: _Optional[bytes] = ...) -> None: ...

class PendingItem(_message.Message):
    __slots__ = ["item", "notice_subject", "producer_id", "sequence", "stored_at_unix_nano", "stream_sequence"]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    NOTICE_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    STREAM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    item: Item
    notice_subject: str
    producer_id: str
    sequence: int
    stored_at_unix_nano: int
    stream_sequence: int
    def __init__(self, item: _Optional[_Union[Item, _Mapping]] = ..., stream_sequence: _Optional[int] = ..., stored_at_unix_nano: _Optional[int] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., notice_subject: _Optional[str] = ...) -> None: ...

class ProducerCheckpoint(_message.Message):
    __slots__ = ["chunk_keys", "chunk_orders", "end", "held", "id", "last_seen_unix_nano", "last_sequence", "notice_subject"]
    CHUNK_KEYS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ORDERS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NOTICE_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    chunk_keys: _containers.RepeatedScalarFieldContainer[int]
    chunk_orders: _containers.RepeatedScalarFieldContainer[int]
    end: bool
    held: _containers.RepeatedCompositeFieldContainer[HeldMessage]
    id: str
    last_seen_unix_nano: int
    last_sequence: int
    notice_subject: str
    def __init__(self, id: _Optional[str] = ..., last_sequence: _Optional[int] = ..., last_seen_unix_nano: _Optional[int] = ..., chunk_keys: _Optional[_Iterable[int]] = ..., held: _Optional[_Iterable[_Union[HeldMessage, _Mapping]]] = ..., end: bool = ..., chunk_orders: _Optional[_Iterable[int]] = ..., notice_subject: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ["applied_sequence", "held", "max_unapplied"]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    MAX_UNAPPLIED_FIELD_NUMBER: _ClassVar[int]
    applied_sequence: int
    held: _containers.RepeatedCompositeFieldContainer[TableProgress]
    max_unapplied: int
    def __init__(self, applied_sequence: _Optional[int] = ..., held: _Optional[_Iterable[_Union[TableProgress, _Mapping]]] = ..., max_unapplied: _Optional[int] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ["code", "item_key", "message", "producer", "sequence", "table"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ITEM_KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    code: Code
    item_key: int
    message: str
    producer: str
    sequence: int
    table: str
    def __init__(self, producer: _Optional[str] = ..., sequence: _Optional[int] = ..., item_key: _Optional[int] = ..., table: _Optional[str] = ..., code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ["table"]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ["status"]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class SampleInfo(_message.Message):
    __slots__ = ["inserted_at_unix_nano", "key", "priority", "probability", "rate_limited", "table_size", "times_sampled"]
    INSERTED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    inserted_at_unix_nano: int
    key: int
    priority: float
    probability: float
    rate_limited: bool
    table_size: int
    times_sampled: int
    def __init__(self, key: _Optional[int] = ..., probability: _Optional[float] = ..., table_size: _Optional[int] = ..., priority: _Optional[float] = ..., times_sampled: _Optional[int] = ..., inserted_at_unix_nano: _Optional[int] = ..., rate_limited: bool = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ["flexible", "layout", "num_samples", "packed", "table", "timeout_ms", "withdraw"]
    FLEXIBLE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    flexible: bool
    layout: PackedLayout
    num_samples: int
    packed: bool
    table: str
    timeout_ms: int
    withdraw: str
    def __init__(self, table: _Optional[str] = ..., num_samples: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., flexible: bool = ..., packed: bool = ..., layout: _Optional[_Union[PackedLayout, str]] = ..., withdraw: _Optional[str] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ["chunks", "items", "packed", "status", "table_size", "weight_exponent", "weight_fraction"]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_EXPONENT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedScalarFieldContainer[bytes]
    items: _containers.RepeatedCompositeFieldContainer[SampledItem]
    packed: PackedSamples
    status: Status
    table_size: int
    weight_exponent: int
    weight_fraction: float
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., items: _Optional[_Iterable[_Union[SampledItem, _Mapping]]] = ..., chunks: _Optional[_Iterable[bytes]] = ..., table_size: _Optional[int] = ..., weight_fraction: _Optional[float] = ..., weight_exponent: _Optional[int] = ..., packed: _Optional[_Union[PackedSamples, _Mapping]] = ...) -> None: ...

class SampledItem(_message.Message):
    __slots__ = ["columns", "info"]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[TrajectoryColumn]
    info: SampleInfo
    def __init__(self, info: _Optional[_Union[SampleInfo, _Mapping]] = ..., columns: _Optional[_Iterable[_Union[TrajectoryColumn, _Mapping]]] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ["code", "message"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: Code
    message: str
    def __init__(self, code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ...) -> None: ...

class StepFormat(_message.Message):
    __slots__ = ["dtype", "step_shape"]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    STEP_SHAPE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    step_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[str] = ..., step_shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TableCheckpoint(_message.Message):
    __slots__ = ["config_json", "counters_json", "items", "limiter_json", "policy_version"]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_JSON_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LIMITER_JSON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    config_json: bytes
    counters_json: bytes
    items: _containers.RepeatedCompositeFieldContainer[ItemCheckpoint]
    limiter_json: bytes
    policy_version: int
    def __init__(self, config_json: _Optional[bytes] = ..., limiter_json: _Optional[bytes] = ..., counters_json: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[ItemCheckpoint, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ["bytes_held", "deletes", "evictions", "insert_waits", "inserts", "limiter", "max_item_version", "max_size", "max_staleness", "max_times_sampled", "min_item_version", "name", "num_deleted_episodes", "num_episodes", "num_unique_samples", "policy_version", "remover", "sample_waits", "sampler", "samples", "signature", "size", "stale_evictions", "weight_exponent", "weight_fraction"]
    BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    INSERT_WAITS_FIELD_NUMBER: _ClassVar[int]
    LIMITER_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEM_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    MIN_ITEM_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_DELETED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    NUM_UNIQUE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REMOVER_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_WAITS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STALE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_EXPONENT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    bytes_held: int
    deletes: int
    evictions: int
    insert_waits: int
    inserts: int
    limiter: LimiterInfo
    max_item_version: int
    max_size: int
    max_staleness: int
    max_times_sampled: int
    min_item_version: int
    name: str
    num_deleted_episodes: int
    num_episodes: int
    num_unique_samples: int
    policy_version: int
    remover: str
    sample_waits: int
    sampler: str
    samples: int
    signature: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    size: int
    stale_evictions: int
    weight_exponent: int
    weight_fraction: float
    def __init__(self, name: _Optional[str] = ..., sampler: _Optional[str] = ..., remover: _Optional[str] = ..., max_size: _Optional[int] = ..., max_times_sampled: _Optional[int] = ..., limiter: _Optional[_Union[LimiterInfo, _Mapping]] = ..., signature: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ..., size: _Optional[int] = ..., bytes_held: _Optional[int] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., deletes: _Optional[int] = ..., evictions: _Optional[int] = ..., insert_waits: _Optional[int] = ..., sample_waits: _Optional[int] = ..., policy_version: _Optional[int] = ..., max_staleness: _Optional[int] = ..., min_item_version: _Optional[int] = ..., max_item_version: _Optional[int] = ..., stale_evictions: _Optional[int] = ..., num_episodes: _Optional[int] = ..., num_deleted_episodes: _Optional[int] = ..., num_unique_samples: _Optional[int] = ..., weight_fraction: _Optional[float] = ..., weight_exponent: _Optional[int] = ...) -> None: ...

class TableProgress(_message.Message):
    __slots__ = ["applied_sequence", "table"]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    applied_sequence: int
    table: str
    def __init__(self, table: _Optional[str] = ..., applied_sequence: _Optional[int] = ...) -> None: ...

class TableRequest(_message.Message):
    __slots__ = ["table"]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ["data", "dtype", "shape"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TrajectoryColumn(_message.Message):
    __slots__ = ["name", "slices", "squeeze"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    SQUEEZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    slices: _containers.RepeatedCompositeFieldContainer[ColumnSlice]
    squeeze: bool
    def __init__(self, name: _Optional[str] = ..., slices: _Optional[_Iterable[_Union[ColumnSlice, _Mapping]]] = ..., squeeze: bool = ...) -> None: ...

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class PackedLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
