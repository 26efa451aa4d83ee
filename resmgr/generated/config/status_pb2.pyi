from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusReply(_message.Message):
    __slots__ = ("config", "source", "policy", "last_error", "pods", "containers", "http_address", "problems", "not_serving")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    NOT_SERVING_FIELD_NUMBER: _ClassVar[int]
    config: str
    source: str
    policy: str
    last_error: str
    pods: int
    containers: int
    http_address: str
    problems: _containers.RepeatedScalarFieldContainer[str]
    not_serving: str
    def __init__(self, config: _Optional[str] = ..., source: _Optional[str] = ..., policy: _Optional[str] = ..., last_error: _Optional[str] = ..., pods: _Optional[int] = ..., containers: _Optional[int] = ..., http_address: _Optional[str] = ..., problems: _Optional[_Iterable[str]] = ..., not_serving: _Optional[str] = ...) -> None: ...

class WatchTopologyRequest(_message.Message):
    __slots__ = ("min_interval",)
    MIN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    min_interval: float
    def __init__(self, min_interval: _Optional[float] = ...) -> None: ...

class TopologyReply(_message.Message):
    __slots__ = ("topology",)
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    topology: str
    def __init__(self, topology: _Optional[str] = ...) -> None: ...

class WatchDevicesRequest(_message.Message):
    __slots__ = ("min_interval",)
    MIN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    min_interval: float
    def __init__(self, min_interval: _Optional[float] = ...) -> None: ...

class DevicesReply(_message.Message):
    __slots__ = ("driver", "devices")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    driver: str
    devices: str
    def __init__(self, driver: _Optional[str] = ..., devices: _Optional[str] = ...) -> None: ...
