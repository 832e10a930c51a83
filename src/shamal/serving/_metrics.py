"""Prometheus metrics of one model server, in a registry of its own.

Names (all labelled by ``model`` and ``version``):

* ``shamal_inference_requests_total`` (+ ``protocol``, ``status``): finished infer calls by
  HTTP-equivalent status (200, 400, 429, 504, ...).
* ``shamal_inference_request_duration_seconds`` (+ ``protocol``): time in the core, queueing
  included, for successful calls.
* ``shamal_inference_batch_size``: rows per batch the runtime ran.
* ``shamal_inference_queue_depth``: requests waiting for a batch.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """The metric families; thread-safe (prometheus-client locks internally)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "shamal_inference_requests",
            "Inference requests by model, version, protocol and status.",
            ("model", "version", "protocol", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "shamal_inference_request_duration_seconds",
            "Time from arrival in the inference core to the answer, queueing included.",
            ("model", "version", "protocol"),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "shamal_inference_batch_size",
            "Rows in each batch run by a model.",
            ("model", "version"),
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "shamal_inference_queue_depth",
            "Requests waiting in a model's batching queue.",
            ("model", "version"),
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
