"""Open Inference Protocol datatypes and their raw (binary) encoding.

The same rules serve the REST binary tensor extension and gRPC ``raw_input_contents`` /
``raw_output_contents``: fixed-size types are little-endian, row-major; ``BYTES`` elements are each
a 4-byte little-endian length followed by that many bytes. Every size is checked before any
allocation, so a hostile shape cannot make the server allocate what the payload does not hold.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from shamal.errors import InvalidParameter

#: OIP datatype name -> numpy dtype (little-endian). BYTES elements are Python ``bytes`` objects.
DATATYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND = {dtype.str: name for name, dtype in DATATYPES.items() if name != "BYTES"}
_LENGTH = struct.Struct("<I")

#: The most elements one tensor may hold (64 Mi): far above any sane request, far below an OOM.
MAX_ELEMENTS = 1 << 26
#: The most dimensions one tensor may have.
MAX_RANK = 16


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype of an OIP datatype name (case-sensitive).

    Raises:
        InvalidParameter: an unknown or unsupported datatype.
    """
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        raise InvalidParameter(
            f"Unsupported datatype {str(datatype)[:32]!r}; use one of {', '.join(DATATYPES)}."
        ) from None


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype name of a numpy array (strings and bytes are BYTES).

    Raises:
        InvalidParameter: a dtype with no OIP name (complex numbers, datetimes, ...).
    """
    kind = array.dtype
    if kind.kind in "OUS":
        return "BYTES"
    name = _BY_KIND.get(kind.newbyteorder("<").str if kind.byteorder == ">" else kind.str)
    if name is None:
        name = _BY_KIND.get(np.dtype(kind.name).str) if kind.kind in "biuf" else None
    if name is None:
        raise InvalidParameter(f"Arrays of dtype {kind} have no Open Inference Protocol datatype.")
    return name


def element_count(shape: Sequence[object]) -> int:
    """Check a requested shape and return its number of elements.

    Raises:
        InvalidParameter: not a list of non-negative integers, too many dimensions, or more
            than :data:`MAX_ELEMENTS` elements.
    """
    if not isinstance(shape, list | tuple) or len(shape) > MAX_RANK:
        raise InvalidParameter(f"A tensor shape must be a list of at most {MAX_RANK} integers.")
    count = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise InvalidParameter("Tensor dimensions must be non-negative integers.")
        count *= dim
        if count > MAX_ELEMENTS:
            raise InvalidParameter(
                f"A tensor may hold at most {MAX_ELEMENTS:,} elements; send smaller batches."
            )
    return count


def from_raw(buffer: bytes | memoryview, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """Decode one tensor from its raw bytes.

    Raises:
        InvalidParameter: the byte count does not match the shape and datatype, or BYTES
            framing is broken.
    """
    dtype = numpy_dtype(datatype)
    count = element_count(shape)
    if datatype == "BYTES":
        return decode_bytes(buffer, count).reshape(tuple(shape))
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidParameter(
            f"Raw data holds {len(buffer)} bytes; shape {list(shape)} of {datatype} "
            f"needs {expected}."
        )
    array = np.frombuffer(buffer, dtype=dtype, count=count)
    if datatype == "BOOL" and count and array.view(np.uint8).max() > 1:
        raise InvalidParameter("BOOL tensors hold only the bytes 0 and 1.")
    return array.reshape(tuple(shape))


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """Encode one tensor as raw bytes (row-major, little-endian)."""
    if datatype == "BYTES":
        return encode_bytes(array)
    dtype = numpy_dtype(datatype)
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def encode_bytes(array: np.ndarray) -> bytes:
    """BYTES elements, each as a 4-byte little-endian length and its bytes (str as UTF-8)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_bytes(buffer: bytes | memoryview, count: int) -> np.ndarray:
    """Exactly ``count`` length-prefixed BYTES elements that fill ``buffer`` exactly.

    Raises:
        InvalidParameter: a truncated element, or bytes left over.
    """
    view = memoryview(buffer)
    if count * 4 > len(view):
        # Checked before allocating: a huge declared shape must not cost memory.
        raise InvalidParameter("BYTES data is shorter than its shape's length prefixes.")
    items = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > len(view):
            raise InvalidParameter("BYTES data ends inside an element's length prefix.")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidParameter("BYTES data is shorter than an element's declared length.")
        items[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise InvalidParameter("BYTES data holds more bytes than its shape declares.")
    return items
