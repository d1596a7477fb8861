from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("box", "discrete", "multi_discrete", "multi_binary", "dict", "tuple")
    BOX_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_FIELD_NUMBER: _ClassVar[int]
    MULTI_DISCRETE_FIELD_NUMBER: _ClassVar[int]
    MULTI_BINARY_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    box: BoxSpace
    discrete: DiscreteSpace
    multi_discrete: MultiDiscreteSpace
    multi_binary: MultiBinarySpace
    dict: DictSpace
    tuple: TupleSpace
    def __init__(self, box: _Optional[_Union[BoxSpace, _Mapping]] = ..., discrete: _Optional[_Union[DiscreteSpace, _Mapping]] = ..., multi_discrete: _Optional[_Union[MultiDiscreteSpace, _Mapping]] = ..., multi_binary: _Optional[_Union[MultiBinarySpace, _Mapping]] = ..., dict: _Optional[_Union[DictSpace, _Mapping]] = ..., tuple: _Optional[_Union[TupleSpace, _Mapping]] = ...) -> None: ...

class BoxSpace(_message.Message):
    __slots__ = ("dtype", "shape", "low", "high")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    low: Tensor
    high: Tensor
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., low: _Optional[_Union[Tensor, _Mapping]] = ..., high: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class DiscreteSpace(_message.Message):
    __slots__ = ("n", "start", "dtype")
    N_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    n: int
    start: int
    dtype: str
    def __init__(self, n: _Optional[int] = ..., start: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class MultiDiscreteSpace(_message.Message):
    __slots__ = ("nvec", "start")
    NVEC_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    nvec: Tensor
    start: Tensor
    def __init__(self, nvec: _Optional[_Union[Tensor, _Mapping]] = ..., start: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class MultiBinarySpace(_message.Message):
    __slots__ = ("shape", "n_is_scalar")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    N_IS_SCALAR_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    n_is_scalar: bool
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., n_is_scalar: _Optional[bool] = ...) -> None: ...

class DictSpace(_message.Message):
    __slots__ = ("entries",)
    class Entry(_message.Message):
        __slots__ = ("key", "space")
        KEY_FIELD_NUMBER: _ClassVar[int]
        SPACE_FIELD_NUMBER: _ClassVar[int]
        key: str
        space: Space
        def __init__(self, key: _Optional[str] = ..., space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DictSpace.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[DictSpace.Entry, _Mapping]]] = ...) -> None: ...

class TupleSpace(_message.Message):
    __slots__ = ("spaces",)
    SPACES_FIELD_NUMBER: _ClassVar[int]
    spaces: _containers.RepeatedCompositeFieldContainer[Space]
    def __init__(self, spaces: _Optional[_Iterable[_Union[Space, _Mapping]]] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("tensor", "dict", "tuple", "text")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    tensor: Tensor
    dict: DictValue
    tuple: TupleValue
    text: str
    def __init__(self, tensor: _Optional[_Union[Tensor, _Mapping]] = ..., dict: _Optional[_Union[DictValue, _Mapping]] = ..., tuple: _Optional[_Union[TupleValue, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class DictValue(_message.Message):
    __slots__ = ("entries",)
    class Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DictValue.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[DictValue.Entry, _Mapping]]] = ...) -> None: ...

class TupleValue(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class GetSpecRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvironmentSpec(_message.Message):
    __slots__ = ("env_id", "observation_space", "action_space", "max_episode_steps", "agents")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    observation_space: Space
    action_space: Space
    max_episode_steps: int
    agents: _containers.RepeatedCompositeFieldContainer[AgentSpec]
    def __init__(self, env_id: _Optional[str] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ..., max_episode_steps: _Optional[int] = ..., agents: _Optional[_Iterable[_Union[AgentSpec, _Mapping]]] = ...) -> None: ...

class AgentSpec(_message.Message):
    __slots__ = ("name", "observation_space", "action_space")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    observation_space: Space
    action_space: Space
    def __init__(self, name: _Optional[str] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...

class EnvRequest(_message.Message):
    __slots__ = ("reset", "step", "close")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    reset: ResetRequest
    step: StepRequest
    close: CloseRequest
    def __init__(self, reset: _Optional[_Union[ResetRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ..., close: _Optional[_Union[CloseRequest, _Mapping]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("seed", "options")
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    seed: int
    options: DictValue
    def __init__(self, seed: _Optional[int] = ..., options: _Optional[_Union[DictValue, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("action", "actions")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    action: Value
    actions: _containers.RepeatedCompositeFieldContainer[AgentAction]
    def __init__(self, action: _Optional[_Union[Value, _Mapping]] = ..., actions: _Optional[_Iterable[_Union[AgentAction, _Mapping]]] = ...) -> None: ...

class AgentAction(_message.Message):
    __slots__ = ("agent", "action")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    agent: str
    action: Value
    def __init__(self, agent: _Optional[str] = ..., action: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvResponse(_message.Message):
    __slots__ = ("reset", "step", "close", "error")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reset: ResetResponse
    step: StepResponse
    close: CloseResponse
    error: Status
    def __init__(self, reset: _Optional[_Union[ResetResponse, _Mapping]] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ..., close: _Optional[_Union[CloseResponse, _Mapping]] = ..., error: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("observation", "info", "agents", "live_agents")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    LIVE_AGENTS_FIELD_NUMBER: _ClassVar[int]
    observation: Value
    info: DictValue
    agents: _containers.RepeatedCompositeFieldContainer[AgentStep]
    live_agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, observation: _Optional[_Union[Value, _Mapping]] = ..., info: _Optional[_Union[DictValue, _Mapping]] = ..., agents: _Optional[_Iterable[_Union[AgentStep, _Mapping]]] = ..., live_agents: _Optional[_Iterable[str]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("observation", "reward", "terminated", "truncated", "info", "agents", "live_agents")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    LIVE_AGENTS_FIELD_NUMBER: _ClassVar[int]
    observation: Value
    reward: float
    terminated: bool
    truncated: bool
    info: DictValue
    agents: _containers.RepeatedCompositeFieldContainer[AgentStep]
    live_agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, observation: _Optional[_Union[Value, _Mapping]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., info: _Optional[_Union[DictValue, _Mapping]] = ..., agents: _Optional[_Iterable[_Union[AgentStep, _Mapping]]] = ..., live_agents: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentStep(_message.Message):
    __slots__ = ("agent", "observation", "reward", "terminated", "truncated", "info")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    agent: str
    observation: Value
    reward: float
    terminated: bool
    truncated: bool
    info: DictValue
    def __init__(self, agent: _Optional[str] = ..., observation: _Optional[_Union[Value, _Mapping]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., info: _Optional[_Union[DictValue, _Mapping]] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
