from actorlearner.v1 import env_pb2 as _env_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Protocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROTOCOL_UNSPECIFIED: _ClassVar[Protocol]
    PROTOCOL_VERSION: _ClassVar[Protocol]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_MSGPACK: _ClassVar[Codec]
    CODEC_MSGPACK_ZLIB: _ClassVar[Codec]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_WIN: _ClassVar[Outcome]
    OUTCOME_DRAW: _ClassVar[Outcome]
    OUTCOME_LOSS: _ClassVar[Outcome]
PROTOCOL_UNSPECIFIED: Protocol
PROTOCOL_VERSION: Protocol
CODEC_UNSPECIFIED: Codec
CODEC_MSGPACK: Codec
CODEC_MSGPACK_ZLIB: Codec
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_WIN: Outcome
OUTCOME_DRAW: Outcome
OUTCOME_LOSS: Outcome

class EnvSpec(_message.Message):
    __slots__ = ("env_id", "observation", "action", "agents")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    observation: _env_pb2.Space
    action: _env_pb2.Space
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env_id: _Optional[str] = ..., observation: _Optional[_Union[_env_pb2.Space, _Mapping]] = ..., action: _Optional[_Union[_env_pb2.Space, _Mapping]] = ..., agents: _Optional[_Iterable[str]] = ...) -> None: ...

class FieldSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class LearnerSpecRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LearnerSpec(_message.Message):
    __slots__ = ("protocol_version", "env_spec", "algorithm", "algorithm_config", "batch_fields", "policy")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_CONFIG_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    env_spec: EnvSpec
    algorithm: str
    algorithm_config: str
    batch_fields: _containers.RepeatedCompositeFieldContainer[FieldSpec]
    policy: _containers.RepeatedCompositeFieldContainer[FieldSpec]
    def __init__(self, protocol_version: _Optional[int] = ..., env_spec: _Optional[_Union[EnvSpec, _Mapping]] = ..., algorithm: _Optional[str] = ..., algorithm_config: _Optional[str] = ..., batch_fields: _Optional[_Iterable[_Union[FieldSpec, _Mapping]]] = ..., policy: _Optional[_Iterable[_Union[FieldSpec, _Mapping]]] = ...) -> None: ...

class ActorMessage(_message.Message):
    __slots__ = ("hello", "batch", "episode_stats", "leave", "actor_id")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    EPISODE_STATS_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: TrajectoryBatch
    episode_stats: EpisodeStats
    leave: Leave
    actor_id: str
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[TrajectoryBatch, _Mapping]] = ..., episode_stats: _Optional[_Union[EpisodeStats, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., actor_id: _Optional[str] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Hello(_message.Message):
    __slots__ = ("actor_id", "protocol_version", "env_spec", "algorithm", "batch_fields", "policy_version", "policy_format", "relay")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    protocol_version: int
    env_spec: EnvSpec
    algorithm: str
    batch_fields: _containers.RepeatedCompositeFieldContainer[FieldSpec]
    policy_version: int
    policy_format: str
    relay: bool
    def __init__(self, actor_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., env_spec: _Optional[_Union[EnvSpec, _Mapping]] = ..., algorithm: _Optional[str] = ..., batch_fields: _Optional[_Iterable[_Union[FieldSpec, _Mapping]]] = ..., policy_version: _Optional[int] = ..., policy_format: _Optional[str] = ..., relay: _Optional[bool] = ...) -> None: ...

class GameResult(_message.Message):
    __slots__ = ("opponent", "outcome", "seat", "length")
    OPPONENT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SEAT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    opponent: str
    outcome: Outcome
    seat: str
    length: int
    def __init__(self, opponent: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., seat: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class TrajectoryBatch(_message.Message):
    __slots__ = ("seq", "policy_version", "num_transitions", "payload", "codec", "priorities", "games", "opponents", "env_steps")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    GAMES_FIELD_NUMBER: _ClassVar[int]
    OPPONENTS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    policy_version: int
    num_transitions: int
    payload: bytes
    codec: Codec
    priorities: _containers.RepeatedScalarFieldContainer[float]
    games: _containers.RepeatedCompositeFieldContainer[GameResult]
    opponents: _containers.RepeatedScalarFieldContainer[str]
    env_steps: int
    def __init__(self, seq: _Optional[int] = ..., policy_version: _Optional[int] = ..., num_transitions: _Optional[int] = ..., payload: _Optional[bytes] = ..., codec: _Optional[_Union[Codec, str]] = ..., priorities: _Optional[_Iterable[float]] = ..., games: _Optional[_Iterable[_Union[GameResult, _Mapping]]] = ..., opponents: _Optional[_Iterable[str]] = ..., env_steps: _Optional[int] = ...) -> None: ...

class EpisodeStats(_message.Message):
    __slots__ = ("returns", "lengths", "env_steps", "policy_version")
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    returns: _containers.RepeatedScalarFieldContainer[float]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    env_steps: int
    policy_version: int
    def __init__(self, returns: _Optional[_Iterable[float]] = ..., lengths: _Optional[_Iterable[int]] = ..., env_steps: _Optional[int] = ..., policy_version: _Optional[int] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("welcome", "policy_update", "ack", "shutdown", "refusal", "league", "actor_id")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    POLICY_UPDATE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    LEAGUE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    policy_update: PolicyUpdate
    ack: Ack
    shutdown: Shutdown
    refusal: Refusal
    league: LeagueUpdate
    actor_id: str
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., policy_update: _Optional[_Union[PolicyUpdate, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ..., league: _Optional[_Union[LeagueUpdate, _Mapping]] = ..., actor_id: _Optional[str] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Settings(_message.Message):
    __slots__ = ("batch_size", "max_unacked", "codec", "actor_priorities", "num_actors", "actor_index", "max_message_bytes", "algorithm_config", "algorithm", "league")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_UNACKED_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    ACTOR_PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    NUM_ACTORS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_CONFIG_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    LEAGUE_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    max_unacked: int
    codec: Codec
    actor_priorities: bool
    num_actors: int
    actor_index: int
    max_message_bytes: int
    algorithm_config: str
    algorithm: str
    league: LeagueSettings
    def __init__(self, batch_size: _Optional[int] = ..., max_unacked: _Optional[int] = ..., codec: _Optional[_Union[Codec, str]] = ..., actor_priorities: _Optional[bool] = ..., num_actors: _Optional[int] = ..., actor_index: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., algorithm_config: _Optional[str] = ..., algorithm: _Optional[str] = ..., league: _Optional[_Union[LeagueSettings, _Mapping]] = ...) -> None: ...

class LeagueSettings(_message.Message):
    __slots__ = ("enabled", "opponent_exploration")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    OPPONENT_EXPLORATION_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    opponent_exploration: float
    def __init__(self, enabled: _Optional[bool] = ..., opponent_exploration: _Optional[float] = ...) -> None: ...

class Opponent(_message.Message):
    __slots__ = ("id", "version", "script", "weight", "rating")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RATING_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: int
    script: str
    weight: float
    rating: float
    def __init__(self, id: _Optional[str] = ..., version: _Optional[int] = ..., script: _Optional[str] = ..., weight: _Optional[float] = ..., rating: _Optional[float] = ...) -> None: ...

class LeagueUpdate(_message.Message):
    __slots__ = ("opponents",)
    OPPONENTS_FIELD_NUMBER: _ClassVar[int]
    opponents: _containers.RepeatedCompositeFieldContainer[Opponent]
    def __init__(self, opponents: _Optional[_Iterable[_Union[Opponent, _Mapping]]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("learner_id", "policy_version", "settings", "batch_fields")
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELDS_FIELD_NUMBER: _ClassVar[int]
    learner_id: str
    policy_version: int
    settings: Settings
    batch_fields: _containers.RepeatedCompositeFieldContainer[FieldSpec]
    def __init__(self, learner_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., settings: _Optional[_Union[Settings, _Mapping]] = ..., batch_fields: _Optional[_Iterable[_Union[FieldSpec, _Mapping]]] = ...) -> None: ...

class PolicyUpdate(_message.Message):
    __slots__ = ("version", "chunk_index", "chunk_count", "total_bytes", "payload", "opponent")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    OPPONENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    chunk_index: int
    chunk_count: int
    total_bytes: int
    payload: bytes
    opponent: str
    def __init__(self, version: _Optional[int] = ..., chunk_index: _Optional[int] = ..., chunk_count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., payload: _Optional[bytes] = ..., opponent: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "accepted", "reason")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    accepted: bool
    reason: str
    def __init__(self, seq: _Optional[int] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("policy_version", "updates", "buffer_size", "inserted", "insert_rate", "sample_rate", "actors", "env_steps", "evaluations", "eval_mean_return", "eval_best_return", "learner_id", "parameters", "changed_parameters", "league")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    INSERT_RATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    EVAL_MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    EVAL_BEST_RETURN_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    LEAGUE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    updates: int
    buffer_size: int
    inserted: int
    insert_rate: float
    sample_rate: float
    actors: _containers.RepeatedCompositeFieldContainer[ActorStatus]
    env_steps: int
    evaluations: int
    eval_mean_return: float
    eval_best_return: float
    learner_id: str
    parameters: _containers.RepeatedCompositeFieldContainer[Parameter]
    changed_parameters: _containers.RepeatedCompositeFieldContainer[Parameter]
    league: LeagueStatus
    def __init__(self, policy_version: _Optional[int] = ..., updates: _Optional[int] = ..., buffer_size: _Optional[int] = ..., inserted: _Optional[int] = ..., insert_rate: _Optional[float] = ..., sample_rate: _Optional[float] = ..., actors: _Optional[_Iterable[_Union[ActorStatus, _Mapping]]] = ..., env_steps: _Optional[int] = ..., evaluations: _Optional[int] = ..., eval_mean_return: _Optional[float] = ..., eval_best_return: _Optional[float] = ..., learner_id: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[Parameter, _Mapping]]] = ..., changed_parameters: _Optional[_Iterable[_Union[Parameter, _Mapping]]] = ..., league: _Optional[_Union[LeagueStatus, _Mapping]] = ...) -> None: ...

class LeagueStatus(_message.Message):
    __slots__ = ("rating", "games", "snapshots", "max_snapshots", "opponents", "unrated_games", "evaluation")
    RATING_FIELD_NUMBER: _ClassVar[int]
    GAMES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    OPPONENTS_FIELD_NUMBER: _ClassVar[int]
    UNRATED_GAMES_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    rating: float
    games: int
    snapshots: int
    max_snapshots: int
    opponents: _containers.RepeatedCompositeFieldContainer[OpponentStatus]
    unrated_games: int
    evaluation: _containers.RepeatedCompositeFieldContainer[EvalRecord]
    def __init__(self, rating: _Optional[float] = ..., games: _Optional[int] = ..., snapshots: _Optional[int] = ..., max_snapshots: _Optional[int] = ..., opponents: _Optional[_Iterable[_Union[OpponentStatus, _Mapping]]] = ..., unrated_games: _Optional[int] = ..., evaluation: _Optional[_Iterable[_Union[EvalRecord, _Mapping]]] = ...) -> None: ...

class EvalRecord(_message.Message):
    __slots__ = ("opponent", "wins", "draws", "losses")
    OPPONENT_FIELD_NUMBER: _ClassVar[int]
    WINS_FIELD_NUMBER: _ClassVar[int]
    DRAWS_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    opponent: str
    wins: int
    draws: int
    losses: int
    def __init__(self, opponent: _Optional[str] = ..., wins: _Optional[int] = ..., draws: _Optional[int] = ..., losses: _Optional[int] = ...) -> None: ...

class OpponentStatus(_message.Message):
    __slots__ = ("opponent", "wins", "draws", "losses", "transitions")
    OPPONENT_FIELD_NUMBER: _ClassVar[int]
    WINS_FIELD_NUMBER: _ClassVar[int]
    DRAWS_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    opponent: Opponent
    wins: int
    draws: int
    losses: int
    transitions: int
    def __init__(self, opponent: _Optional[_Union[Opponent, _Mapping]] = ..., wins: _Optional[int] = ..., draws: _Optional[int] = ..., losses: _Optional[int] = ..., transitions: _Optional[int] = ...) -> None: ...

class Parameter(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SetParametersRequest(_message.Message):
    __slots__ = ("parameters",)
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Parameter]
    def __init__(self, parameters: _Optional[_Iterable[_Union[Parameter, _Mapping]]] = ...) -> None: ...

class SetParametersResponse(_message.Message):
    __slots__ = ("previous", "applied")
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    previous: _containers.RepeatedCompositeFieldContainer[Parameter]
    applied: _containers.RepeatedCompositeFieldContainer[Parameter]
    def __init__(self, previous: _Optional[_Iterable[_Union[Parameter, _Mapping]]] = ..., applied: _Optional[_Iterable[_Union[Parameter, _Mapping]]] = ...) -> None: ...

class ActorStatus(_message.Message):
    __slots__ = ("actor_id", "policy_version", "lag", "batches_per_second", "last_seen_unix", "connected", "duplicates", "inserted", "transitions", "via", "relay")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    policy_version: int
    lag: int
    batches_per_second: float
    last_seen_unix: float
    connected: bool
    duplicates: int
    inserted: int
    transitions: int
    via: str
    relay: bool
    def __init__(self, actor_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., lag: _Optional[int] = ..., batches_per_second: _Optional[float] = ..., last_seen_unix: _Optional[float] = ..., connected: _Optional[bool] = ..., duplicates: _Optional[int] = ..., inserted: _Optional[int] = ..., transitions: _Optional[int] = ..., via: _Optional[str] = ..., relay: _Optional[bool] = ...) -> None: ...
