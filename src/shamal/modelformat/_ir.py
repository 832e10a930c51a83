"""OpenVINO IR (``model.xml`` + ``model.bin``) read as hostile input before OpenVINO sees it.

An IR is an XML graph and a flat weights file; each constant names a byte range of the weights.
OpenVINO's own reader is C++; what reaches it here has been checked: both files are regular
files inside the model folder (symlinks followed), the XML is capped in size, declares no DTD
or entities (no entity expansion, no external references), has a ``net`` root, and every byte
range it names lies inside the weights file. Standard library only.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree  # nosec B405 - DTDs are refused before parsing
from pathlib import Path

from shamal.errors import InvalidParameter

__all__ = ["IR_BINARY", "IR_FILE", "check_openvino_ir"]

IR_FILE = "model.xml"
IR_BINARY = "model.bin"
_MAX_XML_BYTES = 64 << 20
_MAX_LAYERS = 200_000
_DOCTYPE = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def _inside(path: Path, folder: Path, what: str) -> Path:
    target = path.resolve()
    if not target.is_relative_to(folder.resolve()) or not target.is_file():
        raise InvalidParameter(f"The OpenVINO {what} must be a regular file inside the folder.")
    return target


def _byte_ranges(root: ElementTree.Element) -> list[tuple[int, int]]:
    ranges = []
    for data in root.iter("data"):
        offset, size = data.get("offset"), data.get("size")
        if offset is None and size is None:
            continue
        if not (offset or "").isdigit() or not (size or "").isdigit():
            raise InvalidParameter("The OpenVINO graph names a weights range that is not a number.")
        ranges.append((int(offset or 0), int(size or 0)))
    return ranges


def check_openvino_ir(xml_path: Path, folder: Path) -> Path:
    """Check an IR pair and return the weights file (``<xml stem>.bin``; it may be absent
    only when the graph names no weights).

    Raises:
        InvalidParameter: a file outside ``folder`` or not a regular file; an XML over 64 MiB,
            with a DTD or entity declarations, unparsable, or not an IR (``net`` root, layers);
            a weights range past the end of the weights file.
    """
    xml_file = _inside(xml_path, folder, "graph (model.xml)")
    if xml_file.stat().st_size > _MAX_XML_BYTES:
        raise InvalidParameter("The OpenVINO graph (model.xml) is over 64 MiB.")
    text = xml_file.read_bytes()
    if _DOCTYPE.search(text):
        raise InvalidParameter(
            "The OpenVINO graph declares a DTD or entities, which an IR never needs; refused."
        )
    try:
        root = ElementTree.fromstring(text)  # nosec B314 - no DTD, so no entity expansion
    except (ElementTree.ParseError, ValueError, RecursionError):
        raise InvalidParameter("model.xml is not valid XML.") from None
    layers = root.find("layers")
    if root.tag != "net" or layers is None:
        raise InvalidParameter("model.xml is not an OpenVINO IR (no net with layers).")
    if len(layers) > _MAX_LAYERS:
        raise InvalidParameter("The OpenVINO graph has too many layers.")
    ranges = _byte_ranges(root)
    binary = xml_path.with_suffix(".bin")
    if not ranges:
        return binary
    weights = _inside(binary, folder, "weights (model.bin)")
    size = weights.stat().st_size
    if any(offset + length > size for offset, length in ranges):
        raise InvalidParameter(
            "The OpenVINO graph names weights past the end of model.bin (truncated or "
            "mismatched files)."
        )
    return weights
