"""Online features for a request, looked up before the model is called.

A deployment may name a feature service. Its callers then send entity keys, not features:
a request whose inputs are the join keys (``customer_id``: one value per row) and that does
not carry the model's own input is answered by reading the service's features of those
entities from the control plane's online store (one call for the whole request), in the
service's order, as the model's first input; the model runs on them as if the caller had sent
them. An entity without every feature present (never materialized, or past its view's TTL)
fails the request with a clear error, never a prediction on missing values.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shamal.errors import InvalidParameter, ServiceUnavailable, ShamalError
from shamal.serving._datatypes import numpy_dtype
from shamal.serving._repository import ServedModel
from shamal.serving._types import InferInput, InferRequest

__all__ = ["FeatureLookup", "FeatureRows", "OnlineFeatureLookup", "with_features"]

logger = logging.getLogger(__name__)

#: Entities one request may name (the online store's own limit).
MAX_ENTITIES = 10_000


@dataclass(frozen=True, slots=True)
class FeatureRows:
    """Features of some entities: ``values[i, j]`` is entity ``i``'s feature ``names[j]``;
    ``missing`` lists the entities without every feature present."""

    names: tuple[str, ...]
    values: np.ndarray
    missing: tuple[int, ...] = ()


class FeatureLookup(Protocol):
    """Where a serve process gets online features. Thread-safe; ``lookup`` may block."""

    def service(self, model: str) -> str | None:
        """The feature service requests to ``model`` are given (None: none). Memory only."""
        ...

    def lookup(self, service: str, entities: Mapping[str, list[Any]]) -> FeatureRows:
        """The features of ``service`` for each entity (``entities``: join key -> values).

        Raises:
            InvalidParameter: a key the service's views need is not given, or a bad value.
            ServiceUnavailable: the online store cannot be read now.
        """
        ...


class OnlineFeatureLookup:
    """A :class:`FeatureLookup` over the control plane's ``/api/v1/features/online``.

    Args:
        client: a client of the control plane (a ``ShamalClient``) whose token may read the
            service's views.
        service_for: the feature service of a model's requests (a deployment router's spec).
    """

    def __init__(self, client: Any, service_for: Callable[[str], str | None]) -> None:
        self._client = client
        self._service_for = service_for

    def service(self, model: str) -> str | None:
        return self._service_for(model)

    def lookup(self, service: str, entities: Mapping[str, list[Any]]) -> FeatureRows:
        try:
            found = self._client.online_features(entities, feature_service=service)
        except InvalidParameter:
            raise
        except ShamalError as exc:
            raise ServiceUnavailable(
                f"the online features of service {service!r} cannot be read now "
                f"({exc.code.lower()}); retry"
            ) from None
        names = tuple(found["features"])
        count = len(next(iter(entities.values()), []))
        values = np.array(
            [[math.nan if v is None else v for v in found["features"][n]] for n in names],
            dtype=np.float64,
        ).T.reshape(count, len(names))
        views = set(found["views"].values())
        missing = tuple(
            i for i in range(count) if any(found["status"][v][i] != "present" for v in views)
        )
        return FeatureRows(names, values, missing)


def _entities(request: InferRequest) -> dict[str, list[Any]]:
    entities: dict[str, list[Any]] = {}
    for tensor in request.inputs:
        data = tensor.data.reshape(-1)
        if tensor.datatype == "BYTES":
            values = [
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in data
            ]
        else:
            values = data.tolist()
        entities[tensor.name] = values
    counts = {len(v) for v in entities.values()}
    if len(counts) != 1 or not 1 <= next(iter(counts)) <= MAX_ENTITIES:
        raise InvalidParameter(
            f"give each entity key input one value per row (1 to {MAX_ENTITIES:,} rows, the "
            "same for every key)"
        )
    return entities


async def with_features(
    lookup: FeatureLookup, served: ServedModel, request: InferRequest
) -> InferRequest:
    """``request`` with its entity keys turned into the model's first input, when the model's
    deployment names a feature service and the request does not carry that input itself.

    Raises:
        InvalidParameter: keys missing or malformed; an entity without every feature (named
            by its row); a service with a different number of features than the input takes.
        ServiceUnavailable: the online store cannot be read now.
    """
    service = lookup.service(served.name)
    if service is None or not served.metadata.inputs:
        return request
    spec = served.metadata.inputs[0]
    if any(tensor.name == spec.name for tensor in request.inputs):
        return request  # the caller sent the features itself
    entities = _entities(request)
    found = await asyncio.to_thread(lookup.lookup, service, entities)
    if found.missing:
        rows = ", ".join(str(i) for i in found.missing[:5])
        raise InvalidParameter(
            f"no online features of service {service!r} for row(s) {rows} (never "
            "materialized, or older than their view's TTL); materialize, or send the features"
        )
    width = spec.shape[-1] if spec.shape else -1
    if width not in (-1, len(found.names)):
        raise InvalidParameter(
            f"feature service {service!r} gives {len(found.names)} features; input "
            f"{spec.name!r} takes {width}"
        )
    data = found.values.astype(numpy_dtype(spec.datatype))
    features = InferInput(spec.name, spec.datatype, tuple(data.shape), data)
    return _replaced(request, [features])


def _replaced(request: InferRequest, inputs: Sequence[InferInput]) -> InferRequest:
    return InferRequest(
        model=request.model,
        version=request.version,
        id=request.id,
        inputs=list(inputs),
        outputs=request.outputs,
        parameters=request.parameters,
        headers=request.headers,
        deadline=request.deadline,
    )
