from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetNodeReply(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class JsonPatch(_message.Message):
    __slots__ = ("op", "path", "value")
    OP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    op: str
    path: str
    value: str
    def __init__(self, op: _Optional[str] = ..., path: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class PatchNodeRequest(_message.Message):
    __slots__ = ("patches",)
    PATCHES_FIELD_NUMBER: _ClassVar[int]
    patches: _containers.RepeatedCompositeFieldContainer[JsonPatch]
    def __init__(self, patches: _Optional[_Iterable[_Union[JsonPatch, _Mapping]]] = ...) -> None: ...

class PatchNodeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateNodeCapacityRequest(_message.Message):
    __slots__ = ("capacities",)
    class CapacitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CAPACITIES_FIELD_NUMBER: _ClassVar[int]
    capacities: _containers.ScalarMap[str, str]
    def __init__(self, capacities: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateNodeCapacityReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetConfigReply(_message.Message):
    __slots__ = ("node_name", "config")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    config: _containers.ScalarMap[str, str]
    def __init__(self, node_name: _Optional[str] = ..., config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class HealthCheckRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthCheckReply(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...
