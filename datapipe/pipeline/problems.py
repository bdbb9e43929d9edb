"""Pydantic errors as ``key.path: message`` lines, all of them in one pass, with "did you mean".

pydantic reports every field error of a model at once, but a model with an error builds no
object, and what is checked on the object (a stage's language codes, the mixture against the
source names, a source's text field against its input) then waits for the next round: the user
fixes an unknown key and only then learns that a language code is wrong. ``validate_all``
closes that gap: it reports the errors of the mapping as written, then validates a repaired copy
(each bad key dropped so its default applies, a bad choice replaced by the nearest allowed one)
and returns that object, so the later checks still run. The repaired object is only for
checking: a pipeline with problems never runs.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

_BRANCH = re.compile(r"[a-z_]+\[.*\]|function-.*|literal\[.*\]")  # union branch names in a loc, not keys
_KEY = "[key]"  # pydantic's loc part for a mapping's key (by_kind.website: the key itself is not allowed)
_CHOICE_ERRORS = ("literal_error", "enum")
_DROP = object()  # the repair of a key: leave it out (its default applies)


@dataclass
class Validated(Generic[M]):
    """What ``validate_all`` found: the (possibly repaired) object, the problems, and dropped list items."""

    value: M | None  # None when the mapping could not be repaired into a valid object
    problems: list[str] = field(default_factory=list)
    dropped: dict[str, list[int]] = field(default_factory=dict)  # top-level list field -> indices left out


def nearest(value: object, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice ``value`` most likely meant: a case slip, a prefix (website -> web), else difflib's best."""
    if not isinstance(value, str) or not value:
        return None
    by_lower = {c.lower(): c for c in choices}
    low = value.lower()
    if low in by_lower:
        return by_lower[low]
    # One choice that the value starts with or that starts with the value (both at least 3 characters).
    prefixed = [c for lc, c in by_lower.items() if min(len(lc), len(low)) >= 3 and (low.startswith(lc) or lc.startswith(low))]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(low, list(by_lower), n=1, cutoff=cutoff)
    return by_lower[close[0]] if close else None


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` when one choice is near ``value``, else ``""``."""
    hint = nearest(value, choices)
    return f" (did you mean {hint!r}?)" if hint is not None and hint != value else ""


def validate_all(
    model: type[M],
    data: Any,
    prefix: str = "",
    item_lists: tuple[str, ...] = (),
    stand_ins: dict[str, Any] | None = None,
) -> Validated[M]:
    """``model.model_validate(data)`` reporting every problem, with a repaired object for later checks.

    An item of a top-level list named in ``item_lists`` whose required key is wrong is left out of
    the repaired object (its index in ``dropped``); a wrong required top-level key named in
    ``stand_ins`` takes that value; elsewhere a wrong required key leaves no object.
    """
    try:
        return Validated(model.model_validate(data))
    except ValidationError as exc:
        errors = exc.errors()
    problems = format_errors(errors, model, prefix)
    if not isinstance(data, dict):
        return Validated(None, problems)
    repaired = copy.deepcopy(data)
    replace: list[tuple[tuple[Any, ...], Any]] = []
    pops: list[tuple[Any, ...]] = []
    for err in errors:
        action = _repair(model, err, item_lists, stand_ins or {})
        if action is None:
            return Validated(None, problems)  # a required key is wrong: nothing sensible to check further
        loc, new = action
        if new is _DROP:
            pops.append(loc)
        else:
            replace.append((loc, new))
    for loc, new in replace:
        _set(repaired, loc, new)
    dropped: dict[str, list[int]] = {}
    # Keys first, then whole list items from the last one, so no removal moves another's index.
    for loc in sorted(set(pops), key=lambda p: (len(p) == 2 and isinstance(p[1], int), -_index(p))):
        _pop(repaired, loc)
        if len(loc) == 2 and isinstance(loc[1], int):
            dropped.setdefault(str(loc[0]), []).append(loc[1])
    try:
        value = model.model_validate(repaired)
    except ValidationError as exc:  # only cross-key rules are left (min above max): reported as well
        more = [p for p in format_errors(exc.errors(), model, prefix) if p not in problems]
        return Validated(None, problems + more, dropped)
    return Validated(value, problems, {k: sorted(v) for k, v in dropped.items()})


def format_errors(errors: Iterable[Any], model: type[BaseModel], prefix: str = "") -> list[str]:
    """One ``key.path: message`` line per pydantic error, naming what is allowed there."""
    problems = []
    for err in errors:
        loc = _keys(err["loc"])
        path = loc_to_path(loc, prefix)
        if err["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            if parent is None:
                problems.append(f"{path}: unknown key")
                continue
            allowed = list(parent.model_fields)
            hint = did_you_mean(loc[-1], allowed)  # the nearest key, else the whole list (a long one hides the slip)
            problems.append(
                f"{path}: unknown key{hint}" if hint else f"{path}: unknown key; allowed keys here: {', '.join(allowed)}"
            )
        elif err["type"] == "missing":
            problems.append(f"{path}: required key is missing")
        elif err["type"] in _CHOICE_ERRORS:
            choices = _choices(err)
            hint = did_you_mean(err.get("input"), choices)
            problems.append(f"{path}: {show(err.get('input'))} is not allowed: {err['msg']}{hint}")
        else:
            problems.append(f"{path}: {show(err.get('input'))} is not allowed: {err['msg']}")
    return problems


def loc_to_path(loc: Iterable[Any], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if value is not None else "null"
    return text if len(text) <= 80 else text[:77] + "..."


def _keys(loc: Iterable[Any]) -> tuple[Any, ...]:
    """The loc as keys of the mapping: union branch names and the ``[key]`` marker left out."""
    return tuple(p for p in loc if isinstance(p, int) or (p != _KEY and not _BRANCH.fullmatch(str(p))))


def _choices(err: Any) -> list[str]:
    return re.findall(r"'((?:[^'\\]|\\.)*)'", str((err.get("ctx") or {}).get("expected", "")))


def _repair(
    model: type[BaseModel], err: Any, item_lists: tuple[str, ...], stand_ins: dict[str, Any]
) -> tuple[tuple[Any, ...], Any] | None:
    """(loc, replacement or _DROP) that makes this error go away, or None when nothing sensible does."""
    loc = _keys(err["loc"])
    if not loc:
        return None  # a rule over the whole model: nothing to drop
    if len(loc) == 1 and loc[0] in stand_ins:
        return loc, stand_ins[loc[0]]
    if err["type"] in _CHOICE_ERRORS and err["loc"][-1] != _KEY:
        choice = nearest(err.get("input"), _choices(err))
        if choice is not None:
            return loc, choice  # check the rest as if the nearest choice was written (the message suggests it)
    if err["type"] == "extra_forbidden":
        return loc, _DROP
    steps = _containers(model, loc)
    for depth in range(len(loc), 0, -1):  # the deepest key that can go without taking a required one along
        container, part = steps[depth - 1], loc[depth - 1]
        if isinstance(part, int):
            if depth == 2 and loc[0] in item_lists:  # a whole source: left out, its index remembered
                return loc[:depth], _DROP
            continue
        if _is_model(container):
            info = container.model_fields.get(part)
            if info is not None and not info.is_required():
                return loc[:depth], _DROP
        elif container is dict:
            return loc[:depth], _DROP  # an entry of a plain mapping (mixture weights, reader options)
    return None


def _containers(model: type[BaseModel], loc: tuple[Any, ...]) -> list[Any]:
    """For each part of ``loc``, what holds it: a model class, ``dict``, ``list`` or None (unknown)."""
    out: list[Any] = []
    current: Any = model
    for part in loc:
        current = _unwrap(current, part)
        if _is_model(current):
            out.append(current)
            info = current.model_fields.get(part)
            current = info.annotation if info is not None else None
        elif typing.get_origin(current) is dict or current is dict:
            out.append(dict)
            args = typing.get_args(current)
            current = args[1] if len(args) == 2 else None
        elif typing.get_origin(current) is list or current is list:
            out.append(list)
            args = typing.get_args(current)
            current = args[0] if args else None
        else:
            out.append(None)
            current = None
    return out


def _unwrap(annotation: Any, part: Any) -> Any:
    """The branch of an Optional/Union that can hold ``part`` (a list for an index, else a model or dict)."""
    annotation = _bare(annotation)
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return annotation
    for arg in map(_bare, typing.get_args(annotation)):
        origin = typing.get_origin(arg) or arg
        if isinstance(part, int) and origin is list:
            return arg
        if not isinstance(part, int) and (_is_model(arg) or origin is dict):
            return arg
    return annotation


def _bare(annotation: Any) -> Any:
    """``Annotated[T, ...]`` -> T (a tagged union's branches, config/mixture.py's MixtureValue)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the keys at ``loc`` (to list the allowed ones)."""
    if not loc:
        return model
    containers = _containers(model, (*loc, ""))  # what would hold one more key below loc
    owner = containers[-1]
    return owner if _is_model(owner) else None


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _index(loc: tuple[Any, ...]) -> int:
    return loc[1] if len(loc) == 2 and isinstance(loc[1], int) else 0


def _set(data: Any, loc: tuple[Any, ...], value: Any) -> None:
    node = _node(data, loc[:-1])
    if isinstance(node, dict):
        node[loc[-1]] = value


def _pop(data: Any, loc: tuple[Any, ...]) -> None:
    node = _node(data, loc[:-1])
    if isinstance(node, dict):
        node.pop(loc[-1], None)
    elif isinstance(node, list) and isinstance(loc[-1], int) and 0 <= loc[-1] < len(node):
        del node[loc[-1]]


def _node(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data
