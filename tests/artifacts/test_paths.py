"""safe_relpath and contained_path against the hostile-input catalogue (section 1)."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shamal.artifacts import contained_path, safe_relpath
from shamal.errors import InvalidParameter

# Every example of section 1 of the catalogue, by class.
PLAIN = ["../../etc/passwd", "a/../../x", "./../x"]
ABSOLUTE_OR_WINDOWS = [
    "/etc/passwd",
    "//etc/passwd",
    "C:/Windows/win.ini",
    "\\\\server\\share\\x",
    "?path=C:/",
    "C:x",
    "c:/x",
    "./D:/x",
    "https:/host/x",
    "mlflow-artifacts:/1/x",
]
BACKSLASH = ["..\\..\\etc\\passwd", "a\\..\\..\\x"]
ENCODED = [
    "%2e%2e/%2e%2e/etc",
    "..%2f..%2f",
    "%5c",
    "a%5c..%5c..%5cx",
    "%252e%252e%252f",
    "%25252e%25252e%25252fetc",
    "%2525252e%2525252e",
    "%2E%2E/x",
    "%c0%ae%c0%ae/x",  # overlong UTF-8 of "."
]
SEMICOLON_HASH_QUERY = [
    "..;/..;/etc",
    "a;/../../x",
    "a#/../../etc",
    "a%23/..",
    "a?/../../etc",
    "a?/a",
]
STATIC_ROUTE = ["/static/js/../../../../etc/passwd"]
SCHEME_AND_CONTROL = [
    "file:///etc/passwd",
    "a\x00.txt",
    "a%00.txt",
    "a\n../x",
    "a\r\nX-Injected: 1",
    "a%0d%0aX-Injected:%201",
]
LOOKALIKES_AND_SPECIALS = [
    "..\u2215..",
    "\uff0e\uff0e/",
    "\uff0e\uff0e/etc/passwd",
    "a\uff0fb",
    "a\uff3c..\uff3cx",
    "\u2025/x",
    "....//",
    "...",
    " ../x",
    "~root/.ssh/id_rsa",
    "/proc/self/root/etc/passwd",
    "a/\u202etxt.exe",
    "%ef%bc%8e%ef%bc%8e/x",  # fullwidth dots, percent-encoded
]
SIZE_AND_DEVICES = [
    "a" * 5000,
    "/".join(["d"] * 2000),
    "CON",
    "aux.txt",
    "a/nul.tar.gz",
    "Com1",
    "lpt9.log",
    "COM\u00b9",
]
OTHER = ["", "   ", "/", ".", "a/ /b", "a /b", "model.", "%zz%ff", "x" * 256]

HOSTILE = (
    PLAIN
    + ABSOLUTE_OR_WINDOWS
    + BACKSLASH
    + ENCODED
    + SEMICOLON_HASH_QUERY
    + STATIC_ROUTE
    + SCHEME_AND_CONTROL
    + LOOKALIKES_AND_SPECIALS
    + SIZE_AND_DEVICES
    + OTHER
)

LEGAL = {
    "model/weights.safetensors": "model/weights.safetensors",
    "a/b/c.txt": "a/b/c.txt",
    "my file.txt": "my file.txt",
    "\u00fcn\u00efcode/na\u00efve.json": "\u00fcn\u00efcode/na\u00efve.json",
    "u\u0308n\u0131\u0308code/nai\u0308ve.json": "\u00fcn\u0131\u0308code/na\u00efve.json",
    "v1.2/x": "v1.2/x",
    # A colon past the start is a character like any other, as on a stock server.
    "plots/2024-01-01T12:00:00.png": "plots/2024-01-01T12:00:00.png",
    "2024-01-01T12:00:00.json": "2024-01-01T12:00:00.json",
    "a/C:/x": "a/C:/x",
    "model_v1:best/x": "model_v1:best/x",
    ".hidden/config.yaml": ".hidden/config.yaml",
    "./a/./b": "a/b",
    "my%20file.txt": "my file.txt",
    "a%252Fb": "a/b",
    "100%.txt": "100%.txt",
    "%": "%",
    "console.txt": "console.txt",
    "com10/auxiliary.json": "com10/auxiliary.json",
    "a~b/c~": "a~b/c~",
    "metrics-\u65e5\u672c/\u0434\u0430\u043d\u043d\u044b\u0435.csv": (
        "metrics-\u65e5\u672c/\u0434\u0430\u043d\u043d\u044b\u0435.csv"
    ),
}


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_paths_are_rejected_with_a_fixed_message(raw: str) -> None:
    with pytest.raises(InvalidParameter) as excinfo:
        safe_relpath(raw)
    message = excinfo.value.message
    assert message.startswith("Invalid artifact path: ")
    assert "\r" not in message
    assert "\n" not in message
    if len(raw.strip()) > 3:
        assert raw not in message
    assert excinfo.value.code == "INVALID_PARAMETER_VALUE"


@pytest.mark.parametrize(("raw", "expected"), LEGAL.items())
def test_legal_paths_are_accepted_in_normal_form(raw: str, expected: str) -> None:
    assert safe_relpath(raw) == expected


def test_decoding_stops_after_ten_rounds() -> None:
    nested = "x"
    for _ in range(10):
        nested = nested.replace("%", "%25") if "%" in nested else "%78"
    assert safe_relpath(nested) == "x"  # 10 decodes are fine
    with pytest.raises(InvalidParameter, match="too many levels"):
        safe_relpath(nested.replace("%", "%25", 1))


def test_length_and_depth_limits_are_parameters() -> None:
    assert safe_relpath("a/b/c", max_depth=3) == "a/b/c"
    with pytest.raises(InvalidParameter, match="nested too deeply"):
        safe_relpath("a/b/c", max_depth=2)
    assert safe_relpath("abcde", max_length=5) == "abcde"
    with pytest.raises(InvalidParameter, match="too long"):
        safe_relpath("abcdef", max_length=5)


def test_non_strings_are_rejected() -> None:
    with pytest.raises(InvalidParameter):
        safe_relpath(b"a/b")  # type: ignore[arg-type]


# --------------------------------------------------------------------- property
_FRAGMENTS = [".", "..", "/", "\\", "%", "%2e", "%2E", "%2f", "%2F", "%5c", "%25", "%252e"]
_FRAGMENTS += ["2e", "5c", "2f", "25", "a", "b", "~", ";", ":", " ", "\x00", "\uff0e", "\u2215"]
_HOSTILE_TEXT = st.one_of(
    st.text(alphabet=".%/\\2e5cfF~a ", max_size=40),
    st.lists(st.sampled_from(_FRAGMENTS), max_size=16).map("".join),
)
_ROOT = "/srv/store/tenant-a"


def _decodes(raw: str) -> list[str]:
    forms = [raw]
    for _ in range(12):
        forms.append(unquote(forms[-1]))
    return forms


def _escapes(candidate: str) -> bool:
    """Would a naive consumer of this string leave the root (either separator)?

    Naming the root itself ("a/..") counts as leaving it: that is no file below it.
    """
    joined = posixpath.normpath(posixpath.join(_ROOT, candidate.replace("\\", "/")))
    return not joined.startswith(_ROOT + "/")


@pytest.fixture(scope="module")
def property_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("property-root")


@settings(
    max_examples=2500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(raw=_HOSTILE_TEXT)
def test_accepted_paths_stay_contained_after_any_number_of_decodes(
    raw: str, property_root: Path
) -> None:
    try:
        rel = safe_relpath(raw)
    except InvalidParameter:
        return
    for form in [*_decodes(raw), rel]:
        assert not _escapes(form), form
    assert unquote(rel) == rel
    assert safe_relpath(rel) == rel
    assert contained_path(property_root, rel).is_relative_to(property_root.resolve())


def _naive_accepts(raw: str) -> bool:
    """A validator that checks only the raw representation (MLflow's history)."""
    return bool(raw) and ".." not in raw.split("/") and not raw.startswith("/")


def test_the_property_strategy_finds_what_a_naive_validator_misses() -> None:
    """Guards the strength of the generator above: it must catch the '%2e%2e' class."""
    from hypothesis import find

    found = find(
        _HOSTILE_TEXT,
        lambda raw: _naive_accepts(raw) and any(_escapes(f) for f in _decodes(raw)),
        settings=settings(max_examples=3000, database=None, deadline=None),
    )
    assert any(_escapes(f) for f in _decodes(found))


# --------------------------------------------------------------------- on disk
def test_contained_path_maps_under_the_root(tmp_path: Path) -> None:
    assert contained_path(tmp_path, "a/b.txt") == tmp_path.resolve() / "a" / "b.txt"


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a//b", "a/./b", "%2e%2e/x", "a/../b"])
def test_contained_path_refuses_unnormalized_input(tmp_path: Path, rel: str) -> None:
    with pytest.raises(InvalidParameter):
        contained_path(tmp_path, rel)


def test_symlink_out_of_the_store_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / "l").symlink_to("/etc")
    with pytest.raises(InvalidParameter, match="symbolic link"):
        contained_path(root, "l/passwd")
    with pytest.raises(InvalidParameter, match="symbolic link"):
        contained_path(root, "l")


def test_symlink_into_a_sibling_namespace_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    (root / "runs" / "A").mkdir(parents=True)
    (root / "runs" / "B").mkdir(parents=True)
    (root / "runs" / "B" / "secret.txt").write_text("tenant B")
    (root / "runs" / "A" / "evil").symlink_to(root / "runs" / "B")
    (root / "runs" / "A" / "file-link").symlink_to(root / "runs" / "B" / "secret.txt")
    # Both resolve inside the root, and are refused all the same.
    with pytest.raises(InvalidParameter, match="symbolic link"):
        contained_path(root, "runs/A/evil/secret.txt")
    with pytest.raises(InvalidParameter, match="symbolic link"):
        contained_path(root, "runs/A/file-link")


def test_a_file_used_as_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidParameter, match="not a directory"):
        contained_path(tmp_path, "f/child")


def test_a_root_reached_through_a_symlink_still_works(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert contained_path(link, "a/b") == real.resolve() / "a" / "b"
    assert os.path.realpath(link) == str(real.resolve())


@pytest.mark.parametrize("raw", ["a//b", "0//etc/passwd", "0/%2fetc%2fpasswd", "a/./b//c"])
def test_empty_inner_segments_are_refused(raw: str) -> None:
    with pytest.raises(InvalidParameter, match="empty segment"):
        safe_relpath(raw)


def test_a_trailing_slash_names_the_folder() -> None:
    assert safe_relpath("outputs/plots/") == "outputs/plots"
