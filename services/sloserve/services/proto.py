"""The wire types, imported statically from the generated ``sloserve.v1``.

``infra/gen_protos.py`` generates ``sloserve.v1`` from ``protos/`` (committed,
typed ``.pyi`` beside each module); this module only gives the shells short
names for it. Conversions between core types and messages are in ``convert``.
"""

from __future__ import annotations

from sloserve.v1 import (
    common_pb2,
    executor_pb2,
    gateway_pb2,
    perfmodel_pb2,
    router_pb2,
    scheduler_pb2,
)
from sloserve.v1 import executor_pb2_grpc as executor_grpc
from sloserve.v1 import gateway_pb2_grpc as gateway_grpc
from sloserve.v1 import perfmodel_pb2_grpc as perfmodel_grpc
from sloserve.v1 import router_pb2_grpc as router_grpc
from sloserve.v1 import scheduler_pb2_grpc as scheduler_grpc

__all__ = [
    "SERVICE_NAMES", "common_pb2", "executor_grpc", "executor_pb2", "gateway_grpc",
    "gateway_pb2", "perfmodel_grpc", "perfmodel_pb2", "router_grpc", "router_pb2",
    "scheduler_grpc", "scheduler_pb2",
]

SERVICE_NAMES = {
    name.lower(): mod.DESCRIPTOR.services_by_name[name].full_name
    for name, mod in (("Gateway", gateway_pb2), ("Scheduler", scheduler_pb2),
                      ("Executor", executor_pb2), ("PerfModel", perfmodel_pb2),
                      ("Router", router_pb2))
}
