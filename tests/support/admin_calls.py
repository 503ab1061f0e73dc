"""One call of each of Triton's restricted API groups (:data:`chattts_serving.deploy.admin.RESTRICTED_APIS`),
over HTTP and over gRPC: what the admin-token tests send to a real server, and what a unit test
checks against the groups the project restricts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tritonclient.grpc as grpcclient

from chattts_serving import contract

ADMIN_HTTP: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("logging", "GET", "/v2/logging", None),
    ("trace", "GET", "/v2/trace/setting", None),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    ("model-repository", "POST", "/v2/repository/index", {}),
    ("statistics", "GET", f"/v2/models/{contract.MODEL_STREAM}/stats", None),
]
"""One call of each restricted API group over HTTP: (group, method, path, JSON body or None)."""

ADMIN_GRPC: dict[str, Callable[[grpcclient.InferenceServerClient, Any], Any]] = {
    "logging": lambda c, h: c.get_log_settings(headers=h),
    "trace": lambda c, h: c.get_trace_settings(headers=h),
    "shared-memory": lambda c, h: c.get_system_shared_memory_status(headers=h),
    "model-repository": lambda c, h: c.get_model_repository_index(headers=h),
    "statistics": lambda c, h: c.get_inference_statistics(contract.MODEL_STREAM, headers=h),
}
"""One call of each restricted API group over gRPC: group -> call(client, headers)."""
