"""REST bodies of the Open Inference Protocol <-> :class:`InferRequest` / :class:`InferResponse`.

Requests are JSON, optionally followed by binary tensor blobs (the binary tensor data extension:
``Inference-Header-Content-Length`` says where the JSON ends; each input with a
``binary_data_size`` parameter takes that many bytes, in input order, and the blobs must fill the
rest of the body exactly). Every check happens before any allocation the payload does not pay
for: shapes are counted with overflow checks, blob sizes must match shape x element size.

JSON ``data`` may be nested in the tensor's shape or flat. Element types are checked, never
coerced: strings for numbers, floats for integers, out-of-range integers and booleans for
numbers are 400s. FP16 cannot travel as JSON (400, use the binary extension).

A raw binary request (``Inference-Header-Content-Length: 0``) is only the bytes of one input of
a one-input model: :func:`decode_raw_request` takes the tensor's name, datatype and shape from
the model (batch 1; one other variable dimension is inferred from the byte count; a BYTES input
is one element holding the whole body) and asks for every output binary.

Responses: an output goes binary when the caller asked for it (``binary_data`` on the output,
else the request's ``binary_data_output``), and also when JSON cannot carry it exactly: FP16,
float outputs holding NaN or Inf (JSON has no such numbers), BYTES that are not UTF-8.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter, NotImplementedFeature, PayloadTooLarge
from shamal.serving._classification import class_count
from shamal.serving._datatypes import DATATYPES, element_count, from_raw, numpy_dtype, to_raw
from shamal.serving._types import (
    InferInput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    TensorSpec,
)

__all__ = ["decode_body", "decode_raw_request", "decode_request", "encode_response", "is_raw"]

_MAX_TENSORS = 256
_NO_JSON = {"FP16", "BF16"}
_INT_KINDS = "iu"
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
BINARY_KEY = "binary_data_size"
#: A JSON escape of a UTF-16 surrogate: only bodies holding one are walked for lone ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_body(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding: gzip|deflate`` with the size cap applied to the output.

    Raises:
        PayloadTooLarge: the decompressed body would pass ``limit``.
        InvalidParameter: a corrupt stream.
        NotImplementedFeature: another encoding.
    """
    if not encoding or encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise NotImplementedFeature(f"Content-Encoding {encoding[:32]!r} is not supported.")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise InvalidParameter(f"The {encoding} body is corrupt.") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"The decompressed body passes the {limit}-byte limit.")
    return out


def decode_request(
    body: bytes,
    header_length: str | None,
    *,
    model: str,
    version: str | None,
    headers: Mapping[str, str],
) -> InferRequest:
    """Parse one ``/infer`` body.

    Raises:
        InvalidParameter: malformed JSON, schema violations, framing or element mismatches.
        NotImplementedFeature: shared memory.
    """
    json_end = _json_end(body, header_length)
    try:
        doc = json.loads(body[:json_end] if json_end != len(body) else body)
    except RecursionError:
        raise InvalidParameter("The JSON request is nested too deeply.") from None
    except ValueError:
        raise InvalidParameter("The request body is not valid JSON.") from None
    if not isinstance(doc, dict):
        raise InvalidParameter("The request body must be a JSON object.")
    if _SURROGATE_ESCAPE.search(body, 0, json_end) is not None:
        _refuse_lone_surrogates(doc)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidParameter("'id' must be a string.")
    parameters = _parameters(doc.get("parameters"), "request")
    blobs = memoryview(body)[json_end:]
    inputs, used = _inputs(doc.get("inputs"), blobs)
    if used != len(blobs):
        raise InvalidParameter(
            f"The binary data after the JSON holds {len(blobs)} bytes; the inputs' "
            f"binary_data_size parameters add up to {used}."
        )
    default_binary = parameters.get("binary_data_output") is True
    return InferRequest(
        model=model,
        version=version,
        id=request_id,
        inputs=inputs,
        outputs=_outputs(doc.get("outputs"), default_binary),
        parameters=parameters,
        headers=headers,
    )


def _refuse_lone_surrogates(doc: Any) -> None:
    """400 for a string or key holding a lone UTF-16 surrogate (``"\\ud800"``): ``json`` reads
    it, but it is no text (a BYTES element would go to the model as bytes that are not
    UTF-8, an id or name would come back as such). Escaped pairs are one character and pass.

    Raises:
        InvalidParameter: one was found.
    """
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value) is not None:
                raise InvalidParameter("The JSON request holds a lone UTF-16 surrogate (\\ud800).")
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def is_raw(header_length: str | None) -> bool:
    """Whether ``Inference-Header-Content-Length`` announces a raw binary request (0)."""
    if header_length is None:
        return False
    text = header_length.strip()
    return text.isdigit() and len(text) <= 19 and int(text) == 0


def decode_raw_request(
    body: bytes,
    spec: TensorSpec,
    batched: bool,
    *,
    model: str,
    version: str | None,
    headers: Mapping[str, str],
) -> InferRequest:
    """A raw binary request: ``body`` is the bytes of the model's one input ``spec``
    (``batched``: its first dimension is the batch, set to 1). Every output comes back binary.

    Raises:
        InvalidParameter: the bytes do not make a tensor of that input.
    """
    label = f"Raw binary request to input {spec.name[:64]!r}"
    shape = list(spec.shape)
    if batched and shape and shape[0] == -1:
        shape[0] = 1
    if spec.datatype == "BYTES":
        data = _raw_bytes_tensor(body, spec, shape, label)
    else:
        data = _raw_tensor(body, spec, shape, label)
    return _raw_request(spec, data, model, version, headers)


def _raw_bytes_tensor(body: bytes, spec: TensorSpec, shape: list[int], label: str) -> np.ndarray:
    """A raw body for a BYTES input: one element holding the whole body."""
    if any(dim not in (1, -1) for dim in shape):
        raise InvalidParameter(
            f"{label}: a BYTES input of shape {list(spec.shape)} takes more than one "
            "element; send a JSON header with binary_data_size."
        )
    data = np.empty(1, dtype=object)
    data[0] = bytes(body)
    return data.reshape(tuple([1] * len(shape)))


def _raw_tensor(body: bytes, spec: TensorSpec, shape: list[int], label: str) -> np.ndarray:
    """A raw body for a numeric input of ``shape``: at most one variable dimension,
    inferred from the byte count."""
    variable = [axis for axis, dim in enumerate(shape) if dim < 0]
    if len(variable) > 1:
        raise InvalidParameter(
            f"{label}: shape {list(spec.shape)} has more than one variable dimension, so the "
            "byte count cannot fix it; send a JSON header with the shape and binary_data_size."
        )
    itemsize = numpy_dtype(spec.datatype).itemsize
    if variable:
        known = itemsize * element_count([dim for dim in shape if dim >= 0])
        if known == 0 or not body or len(body) % known:
            raise InvalidParameter(
                f"{label}: {len(body)} bytes are not a whole number of {spec.datatype} rows "
                f"of shape {list(spec.shape)}."
            )
        shape[variable[0]] = len(body) // known
    try:
        return from_raw(body, spec.datatype, shape)
    except InvalidParameter as exc:
        raise InvalidParameter(f"{label}: {exc.message}") from None


def _raw_request(
    spec: TensorSpec,
    data: np.ndarray,
    model: str,
    version: str | None,
    headers: Mapping[str, str],
) -> InferRequest:
    return InferRequest(
        model=model,
        version=version,
        id=None,
        inputs=[InferInput(spec.name, spec.datatype, tuple(data.shape), data, {})],
        outputs=[],
        parameters={"binary_data_output": True},
        headers=headers,
    )


def _json_end(body: bytes, header_length: str | None) -> int:
    if header_length is None:
        return len(body)
    text = header_length.strip()
    if not text.isdigit() or len(text) > 19:
        raise InvalidParameter("Inference-Header-Content-Length must be a non-negative integer.")
    length = int(text)
    if length == 0:
        raise InvalidParameter("A raw binary request has no JSON header: decode_raw_request.")
    if length > len(body):
        raise InvalidParameter(
            f"Inference-Header-Content-Length is {length} but the body has {len(body)} bytes."
        )
    return length


def _parameters(raw: object, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidParameter(f"'parameters' of the {where} must be a JSON object.")
    for key in _SHARED_MEMORY:
        if key in raw:
            raise NotImplementedFeature("The shared-memory extension is not supported.")
    return raw


def _inputs(raw: object, blobs: memoryview) -> tuple[list[InferInput], int]:
    if not isinstance(raw, list) or not raw:
        raise InvalidParameter("'inputs' must be a non-empty list of tensors.")
    if len(raw) > _MAX_TENSORS:
        raise InvalidParameter(f"A request may carry at most {_MAX_TENSORS} inputs.")
    cursor = 0
    decoded = []
    for item in raw:
        tensor, cursor = _input(item, blobs, cursor)
        decoded.append(tensor)
    return decoded, cursor


def _input(item: object, blobs: memoryview, cursor: int) -> tuple[InferInput, int]:
    if not isinstance(item, dict):
        raise InvalidParameter("Each input must be a JSON object.")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str) or not name:
        raise InvalidParameter("Each input needs a 'name' string.")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidParameter(
            f"Input {name[:64]!r}: datatype must be one of {', '.join(DATATYPES)}."
        )
    if not isinstance(shape, list):
        raise InvalidParameter(f"Input {name[:64]!r}: 'shape' must be a list of integers.")
    count = element_count(shape)
    parameters = _parameters(item.get("parameters"), f"input {name[:64]!r}")
    size = parameters.get(BINARY_KEY)
    if size is not None:
        if "data" in item:
            raise InvalidParameter(f"Input {name[:64]!r} has both 'data' and binary data.")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidParameter(
                f"Input {name[:64]!r}: binary_data_size must be an integer >= 0."
            )
        if cursor + size > len(blobs):
            raise InvalidParameter(
                f"Input {name[:64]!r} declares {size} binary bytes; fewer follow the JSON."
            )
        try:
            data = from_raw(blobs[cursor : cursor + size], datatype, shape)
        except InvalidParameter as exc:
            raise InvalidParameter(f"Input {name[:64]!r}: {exc.message}") from None
        cursor += size
    elif "data" in item:
        data = json_tensor(item["data"], datatype, shape, count, name)
    else:
        raise InvalidParameter(f"Input {name[:64]!r} has neither 'data' nor binary data.")
    return InferInput(name, datatype, tuple(shape), data, parameters), cursor


def json_tensor(data: object, datatype: str, shape: list[int], count: int, name: str) -> np.ndarray:
    """A JSON ``data`` value (flat or nested) as an array of ``shape`` and ``datatype``.

    Raises:
        InvalidParameter: wrong element types, ragged nesting, or an element count or nesting
            that does not match ``shape``.
    """
    label = f"Input {name[:64]!r}"
    if datatype in _NO_JSON:
        raise InvalidParameter(
            f"{label}: {datatype} cannot travel as JSON numbers; send it with the binary tensor "
            "data extension (binary_data_size)."
        )
    if not isinstance(data, list):
        raise InvalidParameter(f"{label}: 'data' must be a list.")
    if datatype == "BYTES":
        array = _json_bytes(data, label)
    else:
        array = _json_numbers(data, datatype, label)
    if array.ndim > 1 and array.shape != tuple(shape):
        raise InvalidParameter(
            f"{label}: nested 'data' has shape {list(array.shape)}, not {shape}."
        )
    if array.size != count:
        raise InvalidParameter(
            f"{label}: 'data' holds {array.size} elements; shape {shape} needs {count}."
        )
    return array.reshape(tuple(shape))


def _json_numbers(data: list[Any], datatype: str, label: str) -> np.ndarray:
    try:
        array = np.array(data)
    except (ValueError, TypeError, RecursionError, OverflowError):
        raise InvalidParameter(f"{label}: 'data' is ragged or not numbers.") from None
    kind = array.dtype.kind
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidParameter(f"{label}: BOOL data must be true/false.")
        return array
    if kind == "b" or kind not in "iuf":
        raise InvalidParameter(f"{label}: {datatype} data must be JSON numbers.")
    if dtype.kind in _INT_KINDS:
        if kind == "f":  # integers past int64 make numpy pick float64: check them one by one
            return _exact_integers(data, dtype, datatype, label)
        info = np.iinfo(dtype.type)  # type: ignore[type-var]
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise InvalidParameter(f"{label}: a value is out of range for {datatype}.")
    return array.astype(dtype, copy=False)


def _exact_integers(data: list[Any], dtype: np.dtype[Any], datatype: str, label: str) -> np.ndarray:
    """Integer data numpy could not hold exactly (UINT64 above 2**63): every element must be a
    JSON integer in range."""
    info = np.iinfo(dtype.type)
    flat: list[Any] = data
    while flat and isinstance(flat[0], list):
        flat = [item for row in flat for item in (row if isinstance(row, list) else [row])]
    for item in flat:
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidParameter(f"{label}: {datatype} data must be integers.")
        if not info.min <= item <= info.max:
            raise InvalidParameter(f"{label}: a value is out of range for {datatype}.")
    try:
        return np.array(data, dtype=dtype)
    except (ValueError, OverflowError):
        raise InvalidParameter(f"{label}: 'data' is ragged or out of range.") from None


def _json_bytes(data: list[Any], label: str) -> np.ndarray:
    flat: list[bytes] = []
    dims: list[int] = []
    _flatten_strings(data, flat, dims, 0, label)
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    if len(dims) > 1:
        if int(np.prod(dims)) != len(flat):
            raise InvalidParameter(f"{label}: nested 'data' is ragged.")
        return array.reshape(tuple(dims))
    return array


def _flatten_strings(
    data: list[Any], out: list[bytes], dims: list[int], depth: int, label: str
) -> None:
    if depth >= 16:
        raise InvalidParameter(f"{label}: 'data' is nested too deeply.")
    if len(dims) <= depth:
        dims.append(len(data))
    elif dims[depth] != len(data):
        raise InvalidParameter(f"{label}: nested 'data' is ragged.")
    for item in data:
        if isinstance(item, str):
            if len(dims) != depth + 1:
                raise InvalidParameter(f"{label}: nested 'data' is ragged.")
            out.append(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, list):
            _flatten_strings(item, out, dims, depth + 1, label)
        else:
            raise InvalidParameter(f"{label}: BYTES data must be JSON strings.")


def _outputs(raw: object, default_binary: bool) -> list[RequestedOutput]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > _MAX_TENSORS:
        raise InvalidParameter(f"'outputs' must be a list of at most {_MAX_TENSORS} objects.")
    found = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidParameter("Each requested output must be an object with a 'name'.")
        parameters = _parameters(item.get("parameters"), f"output {item['name'][:64]!r}")
        binary = parameters.get("binary_data", default_binary)
        count = class_count(parameters, item["name"])
        found.append(RequestedOutput(item["name"], binary is True, parameters, count))
    return found


def encode_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """The response body and, when binary blobs follow the JSON, the JSON's length."""
    binary_by_name = {wanted.name: wanted.binary for wanted in request.outputs}
    default_binary = request.parameters.get("binary_data_output") is True
    outputs = []
    blobs: list[bytes] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        data = None
        if not binary_by_name.get(tensor.name, default_binary):
            data = _json_data(tensor.data, tensor.datatype)
        if data is None:
            blob = to_raw(tensor.data, tensor.datatype)
            entry["parameters"] = {BINARY_KEY: len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = data
        outputs.append(entry)
    header: dict[str, Any] = {"model_name": response.model_name}
    header["model_version"] = response.model_version
    if response.id is not None:
        header["id"] = response.id
    header["outputs"] = outputs
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if not blobs:
        return text, None
    return b"".join([text, *blobs]), len(text)


def _json_data(array: np.ndarray, datatype: str) -> list[Any] | None:
    """Flat JSON values, or None when JSON cannot carry them exactly (send binary)."""
    if datatype in _NO_JSON:
        return None
    flat = array.reshape(-1)
    if datatype == "BYTES":
        try:
            return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat]
        except UnicodeDecodeError:
            return None
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        return None
    values: list[Any] = flat.tolist()
    return values
