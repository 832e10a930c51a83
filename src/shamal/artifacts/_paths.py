"""The one validator for user-supplied artifact paths, and the containment check.

Every path a caller names (query, path segment, JSON body, archive member) goes
through :func:`safe_relpath` before it is used for anything; every path that
touches the local file system goes through :func:`contained_path`.

Why so strict: each partial fix in the artifact servers we studied checked one
representation of a path and fell to another (``..``, ``%2e%2e``, ``%252e``,
``..;/``, ``..\\``, fullwidth dots, ``//proc/self/root``). So the validator
decodes first, until the string is stable, and then checks the decoded form, its
canonical (NFC) form and its compatibility (NFKC) form against one rule set.
Rejections raise :class:`~shamal.errors.InvalidParameter` with a fixed reason
that never echoes the input (no log or header injection through the message).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import unicodedata
from pathlib import Path
from urllib.parse import unquote

from shamal.errors import InvalidParameter

__all__ = ["contained_path", "safe_relpath"]

logger = logging.getLogger(__name__)

_MAX_DECODE_ROUNDS = 10
_MAX_SEGMENT_BYTES = 255  # NAME_MAX of common file systems
# Characters that may never appear in a path, decoded or not: fragment, matrix
# parameters, query, Windows separators.
_FORBIDDEN_CHARS = frozenset("#;?\\")
# A first segment that reads as a drive letter ("C:") or a URL scheme ("file:"):
# a path must never be mistaken for a location of its own. A colon elsewhere is a
# character like any other ("plots/2024-01-01T12:00:00.png"), as on a stock server:
# artifact paths name index entries, never files of the server's disk.
_DRIVE_OR_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
# ASCII characters with meaning to paths or URLs; a non-ASCII character whose
# compatibility form contains one of them is a look-alike ("\uff0e" -> ".").
_STRUCTURAL_ASCII = frozenset("./\\:;#?%~")
# Look-alikes of "/" and "\" that have no compatibility decomposition.
_SLASH_LOOKALIKES = frozenset("\u2215\u2044\u29f8\u29f5\u2216\u2afd\u2cc1\u3033")
_DEVICE_NAMES = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
    | {f"{port}{n}" for port in ("COM", "LPT") for n in (*"123456789", "¹", "²", "³")}
)


def _reject(reason: str) -> InvalidParameter:
    # The reason is a fixed string chosen by this module, never the input.
    return InvalidParameter(f"Invalid artifact path: {reason}")


def _decode_until_stable(raw: str) -> str:
    current = raw
    for _ in range(_MAX_DECODE_ROUNDS + 1):  # the last round only confirms stability
        try:
            decoded = unquote(current, errors="strict")
        except UnicodeDecodeError:
            raise _reject("percent-encoding is not valid UTF-8") from None
        if decoded == current:
            return current
        current = decoded
    raise _reject("too many levels of percent-encoding")


def _check_characters(text: str) -> None:
    for ch in text:
        # isprintable() is False for controls (NUL, CR, LF, DEL), format
        # characters (bidi overrides, zero-width), separators other than the
        # ASCII space, surrogates, private-use and unassigned code points.
        if not ch.isprintable():
            raise _reject("contains a control or invisible character")
        if ch in _FORBIDDEN_CHARS:
            raise _reject("contains a forbidden character (one of # ; ? \\)")
        if ch in _SLASH_LOOKALIKES:
            raise _reject("contains a look-alike of a path separator")
        if ord(ch) > 0x7F and not _STRUCTURAL_ASCII.isdisjoint(unicodedata.normalize("NFKC", ch)):
            raise _reject("contains a look-alike of a path character")


def _check_segment(segment: str) -> None:
    if segment.strip() != segment:
        raise _reject("a path segment has leading or trailing whitespace")
    if set(segment) == {"."}:
        raise _reject("contains a '..' or all-dots segment")
    if segment.endswith("."):
        # Windows drops trailing dots: "model." and "model" would be one file there.
        raise _reject("a path segment ends with a dot")
    if segment.startswith("~"):
        raise _reject("a path segment starts with '~'")
    stem = segment.split(".", 1)[0].rstrip(" ").upper()
    if stem in _DEVICE_NAMES:
        raise _reject("a path segment is a reserved device name")
    if len(segment.encode("utf-8")) > _MAX_SEGMENT_BYTES:
        raise _reject("a path segment is too long")


def _normalize_form(text: str, *, max_length: int, max_depth: int) -> str:
    """Check one form of a decoded path and return it with empty and '.' segments dropped."""
    _check_characters(text)
    if text.startswith("/"):
        raise _reject("absolute paths are not allowed")
    if "//" in text.rstrip("/"):
        # An empty segment in the middle hides an absolute path behind a prefix
        # ("a//etc/passwd"): refuse it rather than collapse it.
        raise _reject("the path has an empty segment ('//')")
    segments = [s for s in text.split("/") if s not in ("", ".")]
    if not segments:
        raise _reject("the path is empty")
    if _DRIVE_OR_SCHEME.match(segments[0]):
        raise _reject("the path starts with a drive letter or a URL scheme")
    if len(segments) > max_depth:
        raise _reject("the path is nested too deeply")
    for segment in segments:
        _check_segment(segment)
    normalized = "/".join(segments)
    if len(normalized) > max_length:
        raise _reject("the path is too long")
    return normalized


def safe_relpath(raw: str, *, max_length: int = 1024, max_depth: int = 64) -> str:
    """Validate a user-supplied artifact path and return its normal form.

    The input is percent-decoded until it no longer changes (at most 10 rounds),
    then checked in its decoded, NFC and NFKC forms.

    Args:
        raw: the path as the caller sent it.
        max_length: the longest accepted normalized path, in characters.
        max_depth: the most segments accepted.

    Returns:
        A relative POSIX path in NFC form, without empty or ``.`` segments and
        stable under further percent-decoding, e.g. ``"model/weights.safetensors"``.

    Raises:
        InvalidParameter: the path is empty or blank; absolute; starts with a
            drive letter or URL scheme (``C:``, ``file:``); contains control
            characters, ``#``, ``;``, ``?``, ``\\``, ``..`` or all-dots
            segments, segments with outer whitespace, a trailing dot or a
            leading ``~``; uses Unicode look-alikes of ``.`` or ``/``; names a
            Windows device (``CON``, ``aux.txt``); is too long or too deep; or
            is encoded more than 10 times. The message names the rule, never the input.
    """
    if not isinstance(raw, str):
        raise _reject("the path must be a string")
    # Bound the work before decoding: one character may be encoded as up to
    # twelve ("%F0%9F%98%80"), and repeated encodings only grow the input.
    if len(raw) > 12 * max_length + 64:
        raise _reject("the path is too long")
    decoded = _decode_until_stable(raw)
    if not decoded.strip():
        raise _reject("the path is empty")
    nfc = unicodedata.normalize("NFC", decoded)
    nfkc = unicodedata.normalize("NFKC", decoded)
    for form in (decoded, nfkc):
        _normalize_form(form, max_length=max_length, max_depth=max_depth)
    return _normalize_form(nfc, max_length=max_length, max_depth=max_depth)


def contained_path(root: Path, rel: str) -> Path:
    """Join a validated relative path to a directory, refusing every way out.

    ``rel`` must already be in the normal form :func:`safe_relpath` returns.
    The walk refuses any existing component that is a symbolic link, so a link
    planted inside the store can lead neither out of it nor into another
    namespace of it; the joined path is then resolved and checked with
    ``Path.is_relative_to`` against the resolved root.

    Args:
        root: the directory that must contain the result (may itself be reached
            through symbolic links; it is resolved first).
        rel: a normalized relative POSIX path.

    Returns:
        The absolute path of ``rel`` under the resolved ``root``. It need not exist.

    Raises:
        InvalidParameter: ``rel`` is not normalized, a component is a symbolic
            link, or the result would lie outside ``root``.
    """
    if safe_relpath(rel) != rel:
        raise _reject("the path is not in normal form")
    base = root.resolve()
    current = base
    for part in rel.split("/"):
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break  # nothing below a missing component can be a link yet
        except NotADirectoryError:
            raise _reject("a parent of the path is not a directory") from None
        if stat.S_ISLNK(mode):
            logger.warning("refused artifact path through a symbolic link under %s", base)
            raise _reject("the path goes through a symbolic link")
    target = base.joinpath(*rel.split("/")).resolve()
    if not target.is_relative_to(base):
        raise _reject("the path leaves the artifact root")
    return target
