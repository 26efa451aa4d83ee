from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SetConfigRequest(_message.Message):
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

class SetConfigReply(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class SetAdjustmentRequest(_message.Message):
    __slots__ = ("node_name", "adjustment")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    ADJUSTMENT_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    adjustment: str
    def __init__(self, node_name: _Optional[str] = ..., adjustment: _Optional[str] = ...) -> None: ...

class SetAdjustmentReply(_message.Message):
    __slots__ = ("errors",)
    class ErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.ScalarMap[str, str]
    def __init__(self, errors: _Optional[_Mapping[str, str]] = ...) -> None: ...
