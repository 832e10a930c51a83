"""Pure validation of registry inputs: names, versions, stages, aliases, tags, references.

Every function raises :class:`~shamal.errors.InvalidParameter` with a message
that names the rule and never echoes the input back (no log or header
injection through error messages), and returns the value in its canonical form.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from shamal.errors import InvalidParameter, NotFound
from shamal.registry._entities import Stage
from shamal.tracking import Comparison

#: Longest registered model name (the column holds 256 characters).
MAX_NAME_LENGTH = 256
#: Highest version number (the column is a 32-bit integer).
MAX_VERSION = 2**31 - 1
#: Tag keys: MLflow's limit of 250 characters.
MAX_TAG_KEY_LENGTH = 250
#: Tag values: the protocol guarantees at least 5000 bytes; we accept MLflow's 100,000 characters.
MAX_TAG_VALUE_LENGTH = 100_000
#: Alias names: MLflow's limit of 255 characters (the column holds 256).
MAX_ALIAS_LENGTH = 255
#: The alias every model has (any case): its newest version; no alias can be set by this name.
LATEST_ALIAS = "latest"
#: Sources, storage locations and run links (the columns hold 1024 characters).
MAX_URI_LENGTH = 1024
#: Descriptions of models and versions.
MAX_DESCRIPTION_LENGTH = 100_000
#: Tags sent with one create call.
MAX_TAGS_PER_REQUEST = 100

#: The tag MLflow puts on registered prompts (prompts live in the model registry).
PROMPT_TAG = "mlflow.prompt.is_prompt"
#: The sources MLflow's clients send for a prompt version, which has no files: the only
#: sources a prompt version can have (a stock server refuses any other).
PROMPT_SOURCES = frozenset({"prompt-template", "dummy-source"})

#: Tags as a caller gives them: a mapping, or (key, value) pairs in order (last one wins).
TagsIn = Mapping[str, str] | Iterable[tuple[str, str]] | None

_ALIAS_RE = re.compile(r"[\w\-]+")
_VERSION_ALIAS_RE = re.compile(r"[vV]\d+")
_REFERENCE_ID_RE = re.compile(r"[A-Za-z0-9_\-]+")
#: Tag keys: what a stock server takes (letters and digits of any script, ``_``, ``-``,
#: ``.``, space, ``:`` and ``/``).
_TAG_KEY_RE = re.compile(r"[\w.\- :/]+")
_VERSION_RE = re.compile(r"[+-]?[0-9]+")
_STAGES = {stage.value.lower(): stage for stage in Stage}


def _printable(text: str) -> bool:
    return all(ch.isprintable() for ch in text)


def check_model_name(name: str, field: str = "name") -> str:
    """A registered model name: what ``models:/<name>/...`` URIs can carry.

    Rules (MLflow's, plus ours): not blank, at most 256 characters, no ``/`` or
    ``:``, no control or invisible characters, and already a normal path
    (no ``.``/``..`` segments, no leading ``/``).
    """
    if not name or not name.strip():
        raise InvalidParameter(f"Missing value for required parameter '{field}'.")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidParameter(f"'{field}' is longer than {MAX_NAME_LENGTH} characters.")
    if "/" in name or ":" in name:
        raise InvalidParameter(f"Invalid model name '{name}'. Names cannot contain '/' or ':'.")
    if not _printable(name):
        raise InvalidParameter(f"Invalid '{field}': it contains control or invisible characters.")
    normal = posixpath.normpath(name)
    if normal != name or normal in (".", "..") or normal.startswith(".."):
        raise InvalidParameter(f"Invalid '{field}': the name is not in normal form.")
    return name


def parse_version(value: Any) -> int:
    """A model version as MLflow sends it: a string (or number) holding an integer.

    Raises:
        InvalidParameter: not an integer (``x``, ``1.0``, ``latest``).
        NotFound: an integer no version can have (0, negative, past the column's range):
            a stock server looks it up and finds nothing.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidParameter(_not_an_integer("version", value))
    text = str(value) if isinstance(value, int) else value.strip()
    if not _VERSION_RE.fullmatch(text):
        raise InvalidParameter(_not_an_integer("version", value))
    number = int(text)
    if not 1 <= number <= MAX_VERSION:
        raise NotFound(f"Model version {number} does not exist.")
    return number


def _not_an_integer(field: str, value: Any) -> str:
    """A stock server's words for a field that is not an integer (the value cut short)."""
    return f"Parameter '{field}' must be an integer, got '{str(value)[:64]}'."


def parse_stage(value: str) -> Stage:
    """A stage name, case-insensitive: ``None``, ``Staging``, ``Production``, ``Archived``."""
    stage = _STAGES.get(value.strip().lower()) if isinstance(value, str) else None
    if stage is None:
        allowed = ", ".join(s.value for s in Stage)
        shown = str(value)[:64]
        raise InvalidParameter(
            f"Invalid Model Version stage: {shown}. Value must be one of {allowed}."
        )
    return stage


def check_alias_name(alias: str) -> str:
    """An alias name, by a stock server's rules for looking one up or deleting it: letters
    and digits (of any script), ``_`` and ``-``, at most 255 characters."""
    if not alias:
        raise InvalidParameter("Registered model alias name cannot be empty.")
    if len(alias) > MAX_ALIAS_LENGTH:
        raise InvalidParameter(f"Alias names are at most {MAX_ALIAS_LENGTH} characters long.")
    if not _ALIAS_RE.fullmatch(alias):
        raise InvalidParameter(
            f"Invalid alias name: '{alias}'. Names may only contain alphanumerics, "
            "underscores (_), and dashes (-)."
        )
    return alias


def check_alias(alias: str) -> str:
    """An alias name that can be set: :func:`check_alias_name`, and not reserved.

    Reserved, as MLflow reserves them (``models:/name@...`` would be ambiguous):
    ``latest`` in any case, and names that look like versions (``v1``, ``V12``).
    """
    check_alias_name(alias)
    if alias.lower() == LATEST_ALIAS:
        raise InvalidParameter("'latest' alias name (case insensitive) is reserved.")
    if _VERSION_ALIAS_RE.fullmatch(alias):
        raise InvalidParameter(f"Version alias name '{alias}' is reserved.")
    return alias


def check_tag(key: Any, value: Any) -> tuple[str, str]:
    """A tag of a registered model or a model version, by a stock server's rules: a key
    that passes :func:`check_tag_key` and has at most 250 characters, and a string value
    of at most 100,000 characters."""
    key = check_tag_key(key)
    if len(key) > MAX_TAG_KEY_LENGTH:
        raise InvalidParameter(f"Tag keys are at most {MAX_TAG_KEY_LENGTH} characters long.")
    if not isinstance(value, str):
        raise InvalidParameter("A tag value must be a string.")
    if len(value) > MAX_TAG_VALUE_LENGTH:
        raise InvalidParameter(f"Tag values are at most {MAX_TAG_VALUE_LENGTH} characters long.")
    return key, value


def check_tag_key(key: Any) -> str:
    """A tag key, by a stock server's rules (which also hold for deleting a tag, where a
    stock server does not check the length): not empty; only letters and digits (of any
    script), ``_``, ``-``, ``.``, spaces, ``:`` and ``/``; and a normal relative path, since
    keys may be used as file names (no ``.`` or ``..`` segment, no leading ``..``, no
    leading, trailing or doubled ``/``).
    """
    if not isinstance(key, str) or not key:
        raise InvalidParameter("Missing value for required parameter 'key': a tag key.")
    if not _TAG_KEY_RE.fullmatch(key):
        raise InvalidParameter(
            "Invalid tag key: use only letters, digits, underscores (_), dashes (-), "
            "periods (.), spaces ( ), colons (:) and slashes (/)."
        )
    normal = posixpath.normpath(key)
    if normal != key or normal == "." or normal.startswith(("..", "/")):
        raise InvalidParameter(
            "Invalid tag key: keys may be used as file names and must be normal relative "
            "paths: no '.' or '..' segments, no leading '..', no leading, trailing or "
            "doubled '/'."
        )
    return key


def check_tags(tags: TagsIn) -> dict[str, str]:
    """Tags given with a create call; a repeated key keeps its last value."""
    items = tags.items() if isinstance(tags, Mapping) else (tags or ())
    checked: dict[str, str] = {}
    for key, value in items:
        k, v = check_tag(key, value)
        checked[k] = v
        if len(checked) > MAX_TAGS_PER_REQUEST:
            raise InvalidParameter(f"At most {MAX_TAGS_PER_REQUEST} tags per request.")
    return checked


def check_description(description: str | None) -> str:
    if description is None:
        return ""
    if not isinstance(description, str):
        raise InvalidParameter("Parameter 'description' must be a string.")
    if len(description) > MAX_DESCRIPTION_LENGTH:
        raise InvalidParameter(
            f"Descriptions are at most {MAX_DESCRIPTION_LENGTH} characters long."
        )
    return description


def check_reference_id(value: str | None, field: str, max_length: int) -> str | None:
    """An id minted elsewhere (a run id, a logged model id): letters, digits, ``_``, ``-``."""
    if value is None or value == "":
        return None
    if len(value) > max_length or not _REFERENCE_ID_RE.fullmatch(value):
        raise InvalidParameter(f"Parameter '{field}' is not a valid id.")
    return value


def check_uri_length(value: str, field: str) -> str:
    if len(value) > MAX_URI_LENGTH:
        raise InvalidParameter(f"Parameter '{field}' is longer than {MAX_URI_LENGTH} characters.")
    return value


def check_run_link(value: str | None) -> str:
    if not value:
        return ""
    check_uri_length(value, "run_link")
    if not _printable(value):
        raise InvalidParameter("Parameter 'run_link' contains control or invisible characters.")
    return value


def is_prompt(tags: Mapping[str, str]) -> bool:
    """Whether tags mark a prompt (or a prompt version): ``mlflow.prompt.is_prompt`` is
    ``true`` in any case, as a stock server reads it."""
    return tags.get(PROMPT_TAG, "false").lower() == "true"


def check_prompt_source(source: str) -> str:
    """The source of a new prompt version: one of MLflow's placeholders, nothing to resolve."""
    if source not in PROMPT_SOURCES:
        allowed = " or ".join(repr(s) for s in sorted(PROMPT_SOURCES))
        raise InvalidParameter(f"Invalid prompt source: a prompt version's source is {allowed}.")
    return source


def split_prompt_clauses(filters: list[Comparison]) -> tuple[list[Comparison], bool]:
    """Take MLflow's prompt clauses out of a parsed registry filter.

    The stock client adds ``tags.`mlflow.prompt.is_prompt` != 'true'`` to every
    registered-model search: it means "models, not prompts", and must match
    models that have no such tag at all (a plain tag clause needs the tag).
    ``= 'true'`` or ``!= 'false'`` ask for prompts instead.

    Returns:
        The other clauses, and True when prompts (rather than models) are asked for.
    """
    rest: list[Comparison] = []
    prompts = False
    for clause in filters:
        value = clause.value.lower() if isinstance(clause.value, str) else None
        if (
            clause.entity == "tag"
            and clause.key == PROMPT_TAG
            and clause.op in ("=", "!=")
            and value in ("true", "false")
        ):
            prompts = (clause.op == "=") == (value == "true")
            continue
        rest.append(clause)
    return rest, prompts
