"""The typed configuration layer: settings dataclasses checked by pydantic models made from them.

The settings a component takes stay frozen dataclasses (the decision cores know no pydantic); this
module makes a strict pydantic model of each (`model_of`: one field per dataclass field, its type
hint, its default, unknown keys forbidden) and owns everything around it:

- `typed_values`: one table (parsed TOML) checked against a dataclass, every problem named by its
  key path with the type or the allowed values (a ``Literal`` hint lists them);
- `Layers`: TOML file, ``RASD_*`` environment variables and flags merged with that precedence
  (flags > environment > file > defaults), each value remembering where it came from, so that an
  error names the file, the variable or the flag;
- `schema_of`: the JSON Schema of a model, as the Helm chart's values.schema.json embeds it.

Values are validated as TOML would give them: strict types (no "5" for 5, no 1 for true), integers
accepted where a number is expected, lists where a tuple is. Validating the JSON text of the table in
pydantic's strict mode gives exactly that.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import json
import re
import textwrap
import tomllib
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pydantic

ENV_PREFIX = "RASD_"
"""Environment variables read as settings: ``RASD_<KEY>`` or ``RASD_<TABLE>__<KEY>`` (any depth)."""


def require(ok: bool, path: str, message: str, value: Any, error: type[Exception]) -> None:
    """Raise error("<path>: <message>, got <value>") unless ok."""
    if not ok:
        raise error(f"{path}: {message}, got {value!r}")


_STRICT = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


@functools.cache
def model_of(cls: type[Any], skip: frozenset[str] = frozenset()) -> type[pydantic.BaseModel]:
    """The strict pydantic model of settings dataclass cls (nested dataclasses become nested models).

    Args:
        cls: a dataclass whose hints are bool, int, float, str, Literal, X | None, tuple[X, ...],
            Mapping[K, V], another such dataclass, or any of these Annotated with annotated_types
            constraints (ranges that also go into the JSON Schema).
        skip: fields typed Any here (tables the caller parses itself).
    """
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = attribute_docs(cls)
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        hint = Any if field.name in skip else _edge_hint(hints[field.name])
        described: dict[str, Any] = {"description": docs[field.name]} if field.name in docs else {}
        if field.default is not dataclasses.MISSING:
            default: Any = pydantic.Field(default=_plain(field.default), **described)
        elif field.default_factory is not dataclasses.MISSING:
            factory = functools.partial(_plain_default, field.default_factory)
            default = pydantic.Field(default_factory=factory, **described)
        else:
            default = pydantic.Field(**described)
        fields[field.name] = (hint, default)
    with warnings.catch_warnings():
        # A setting may be named like a BaseModel method ("validate": run the validation suite); the
        # model is only ever read field by field (its values live in the instance), so the shadow is harmless.
        warnings.filterwarnings("ignore", message=r'Field name ".*" in ".*" shadows an attribute in parent "BaseModel"')
        model = pydantic.create_model(cls.__name__, __config__=_STRICT, __doc__=_first_line(cls.__doc__), **fields)
    _DATACLASS_OF[model] = cls
    return model


_DATACLASS_OF: dict[type[pydantic.BaseModel], type[Any]] = {}


def _edge_hint(hint: Any) -> Any:
    """A dataclass hint with every nested settings dataclass replaced by its model."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return model_of(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        inner, *extras = typing.get_args(hint)
        return typing.Annotated[(_edge_hint(inner), *extras)]
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(lambda a, b: a | b, (_edge_hint(arg) for arg in typing.get_args(hint)))
    if origin is tuple:
        return tuple[tuple(_edge_hint(arg) if arg is not Ellipsis else arg for arg in typing.get_args(hint))]
    if origin in (Mapping, dict, typing.Mapping):
        key, value = typing.get_args(hint)
        return dict[key, _edge_hint(value)]  # type: ignore[valid-type]
    return hint


def _plain(value: Any) -> Any:
    """A dataclass default as plain data for the model (nested dataclasses as dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _plain_default(factory: Callable[[], Any]) -> Any:
    return _plain(factory())


def _first_line(doc: str | None) -> str | None:
    return doc.strip().splitlines()[0] if doc else None


def attribute_docs(cls: type[Any]) -> dict[str, str]:
    """The docstring under each field of cls (``x: int = 1`` then ``\"\"\"What x is.\"\"\"``), one line each."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    except (OSError, TypeError, IndexError, AttributeError):
        return {}
    docs = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):  # fmt: skip
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def to_dataclass(value: Any) -> Any:
    """A validated model (or a value holding models) as the settings dataclasses the code takes."""
    if isinstance(value, pydantic.BaseModel):
        cls = _DATACLASS_OF.get(type(value))
        fields = {name: to_dataclass(getattr(value, name)) for name in type(value).model_fields}
        return cls(**fields) if cls is not None else fields
    if isinstance(value, Mapping):
        return {k: to_dataclass(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(to_dataclass(v) for v in value)
    return value


# --------------------------------------------------------------------------------------------
# Problems: one line each, key path first


def _toml_json(value: Any) -> str:
    """A parsed TOML value as JSON text (a TOML date or time is refused by every settings type)."""
    return json.dumps(value, default=lambda other: {"<toml datetime>": str(other)})


def validate(model: type[pydantic.BaseModel], data: Any) -> tuple[pydantic.BaseModel | None, list[Problem]]:
    """data (parsed TOML, or merged layers) validated by model: the model, or the problems."""
    try:
        return model.model_validate_json(_toml_json(data), strict=True), []
    except pydantic.ValidationError as exc:
        return None, [_problem(model, error) for error in exc.errors(include_url=False)]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One bad setting: its key path, what is wrong, and the value."""

    path: tuple[str | int, ...]
    message: str

    def dotted(self, prefix: str = "") -> str:
        """The key path as written in messages: ``power.tree.rows[0].budget_w``."""
        text = prefix.rstrip(".")
        for part in self.path:
            if isinstance(part, int):
                text += f"[{part}]"
                continue
            # A key as typed, unless it could garble the terminal or the log line: then quoted and cut.
            name = part if part.isprintable() and len(part) <= 80 else show(part)
            text += f".{name}" if text else name
        return text or "<root>"


def _problem(model: type[pydantic.BaseModel], error: Any) -> Problem:
    loc = tuple(error["loc"])
    kind = error["type"]
    if loc and loc[-1] == "[key]":  # a table key of the wrong type (Xid overrides' keys are numbers)
        return Problem(loc[:-1], f"the key must be {_expected(error)}")
    got = f", got {show(error['input'])}"
    if kind == "extra_forbidden":
        known = _known_keys(model, loc[:-1])
        return Problem(loc, "unknown setting" + (f" (known: {', '.join(known)})" if known else ""))
    if kind == "missing":
        return Problem(loc, "required")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return Problem(loc, f"expected {_range(model, loc)}{got}")
    if kind == "string_pattern_mismatch":
        return Problem(loc, f"expected a string matching {error['ctx']['pattern']}{got}")
    return Problem(loc, f"expected {_expected(error)}{got}")


def _range(model: type[pydantic.BaseModel], loc: tuple[Any, ...]) -> str:
    """The whole range a number takes, as one phrase: "an integer in 50..5000", "a number > 0"."""
    node: Any = model
    for part in loc[:-1]:
        node = _field_type(node, part) if node is not None else None
    field = node.model_fields.get(loc[-1]) if isinstance(node, type) and issubclass(node, pydantic.BaseModel) else None
    if field is None:
        return "a number in range"
    bounds = {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in _constraints(field)}
    low = f">= {bounds['Ge']}" if "Ge" in bounds else f"> {bounds['Gt']}" if "Gt" in bounds else ""
    high = f"<= {bounds['Le']}" if "Le" in bounds else f"< {bounds['Lt']}" if "Lt" in bounds else ""
    noun = "an integer" if _unwrap(field.annotation) is int else "a number"
    if "Ge" in bounds and "Le" in bounds:
        return f"{noun} in {bounds['Ge']}..{bounds['Le']}"
    return f"{noun} {' and '.join(b for b in (low, high) if b)}"


def _constraints(field: Any) -> list[Any]:
    """The annotated_types bounds of a field, wherever its hint put them (also inside `X | None`)."""
    found = list(field.metadata)
    hint = field.annotation
    for arg in typing.get_args(hint) if typing.get_origin(hint) in (types.UnionType, typing.Union) else ():
        if typing.get_origin(arg) is typing.Annotated:
            for extra in typing.get_args(arg)[1:]:
                found.extend(getattr(extra, "metadata", [extra]))
    return [m for m in found if type(m).__name__ in ("Ge", "Gt", "Le", "Lt")]


_PLAINER = {"a valid integer": "an integer", "a valid number": "a number", "a valid string": "a string",
            "a valid boolean": "true or false", "a valid dictionary": "a table", "an object": "a table",
            "a valid list": "a list", "a valid array": "a list", "a valid tuple": "a list"}  # fmt: skip


_SIZED = re.compile(r"(String|List|Tuple|Dictionary) should have (.*?)(?: after validation)?(?:, not \d+)?$")


def _expected(error: Any) -> str:
    message = str(error["msg"])
    sized = _SIZED.match(message)
    if sized:  # "String should have at least 1 character" -> "a string of at least 1 character"
        kind = {"String": "string", "Dictionary": "table"}.get(sized[1], "list")
        return f"a {kind} of {sized[2]}"
    message = message.removeprefix("Input should be ")
    for pydantic_words, ours in _PLAINER.items():
        if message.startswith(pydantic_words):
            return ours + message[len(pydantic_words) :]
    return message


def show(value: Any) -> str:
    """A value as TOML spells it, nearly: "fast", true, 12, ["a"] (JSON's scalars are TOML's)."""
    text = json.dumps(value, default=repr, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _known_keys(model: type[pydantic.BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys the table at path takes (for "unknown setting" messages)."""
    node: Any = model
    for part in path:
        node = _field_type(node, part)
        if node is None:
            return []
    if not (isinstance(node, type) and issubclass(node, pydantic.BaseModel)):
        return []
    return sorted(field.alias or name for name, field in node.model_fields.items())


def _field_type(node: Any, part: Any) -> Any:
    """The type one step below node (a model's field, a table's or list's items), unwrapped."""
    if isinstance(node, type) and issubclass(node, pydantic.BaseModel):
        field = node.model_fields.get(part) if isinstance(part, str) else None
        return None if field is None else _unwrap(field.annotation)
    origin = typing.get_origin(node)
    if origin in (dict, tuple, list):
        return _unwrap(typing.get_args(node)[-1 if origin is dict else 0])
    return None


def _unwrap(hint: Any) -> Any:
    """hint without Annotated and without `| None`."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated:
            hint = typing.get_args(hint)[0]
        elif origin in (types.UnionType, typing.Union):
            args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            if len(args) != 1:
                return hint
            hint = args[0]
        else:
            return hint


def typed_values(
    cls: type[Any],
    data: Any,
    prefix: str,
    error: type[Exception],
    *,
    skip: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
    """The values of data (one table) for dataclass cls, checked by `model_of(cls)`.

    Args:
        cls: a settings dataclass (see `model_of`).
        data: the table.
        prefix: the table's key path ("quarantine.kubernetes."), for error messages.
        error: the exception to raise, with one line per problem.
        skip: keys accepted but not checked here (nested tables the caller parses itself).

    Returns:
        Keyword arguments for cls: the keys data has, typed (nested settings as dataclasses).
    """
    model = model_of(cls, frozenset(skip))
    checked, problems = validate(model, data)
    if checked is None:
        raise error("\n".join(f"{p.dotted(prefix)}: {p.message}" for p in problems))
    return {name: to_dataclass(getattr(checked, name)) for name in checked.model_fields_set}


# --------------------------------------------------------------------------------------------
# Layers: file < environment < flags


@dataclasses.dataclass
class Layers:
    """Settings from several sources merged key by key, each leaf remembering its source.

    Add the sources from the lowest precedence to the highest (file, environment, flags): a later
    value of the same key wins; tables merge.
    """

    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)

    def add(self, table: Mapping[str, Any], source: Callable[[tuple[str, ...]], str]) -> None:
        """Merge table in; source(path) names where the value at path came from (for messages)."""
        self._merge(self.data, table, (), source)

    def _merge(self, into: dict[str, Any], table: Mapping[str, Any], path: tuple[str, ...], source: Any) -> None:
        for key, value in table.items():
            here = (*path, key)
            if isinstance(value, Mapping):
                if not isinstance(into.get(key), dict):
                    into[key] = {}
                self._merge(into[key], value, here, source)  # each leaf keeps its own source
                continue
            into[key] = value
            self.sources = {p: s for p, s in self.sources.items() if p[: len(here)] != here}
            self.sources[here] = source(here)

    def source_of(self, path: Iterable[Any]) -> str:
        """Where the value at path (or the table holding it) came from; "default" if nowhere."""
        keys = tuple(str(part) for part in path if not isinstance(part, int))
        for end in range(len(keys), 0, -1):
            if keys[:end] in self.sources:
                return self.sources[keys[:end]]
        below = sorted({s for p, s in self.sources.items() if p[: len(keys)] == keys})
        return " and ".join(below) or "default"


def env_table(model: type[pydantic.BaseModel], environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings in environ: ``RASD_DB`` → db, ``RASD_LEADER__LEASE_S`` → leader.lease_s.

    A variable is read when its first part names a field of model (``RASD_BMC_PASSWORD`` or
    ``RASD_TEST_POSTGRES_URL`` are not settings and are left alone); below that, an unknown key is
    refused by the model like a file's. A value is read as a TOML value (``5``, ``2.5``, ``true``,
    ``["reset_gpu"]``) unless the key takes a string, where it is taken as it is.
    """
    table: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        if path[0] not in model.model_fields or not all(path):
            continue
        node = table
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[path[-1]] = _env_value(model, path, raw)
    return table


def env_name(path: tuple[str, ...]) -> str:
    """The variable that sets path: ("leader", "lease_s") → RASD_LEADER__LEASE_S."""
    return ENV_PREFIX + "__".join(path).upper()


def _env_value(model: type[pydantic.BaseModel], path: tuple[str, ...], raw: str) -> Any:
    node: Any = model
    for part in path:
        node = _field_type(node, part) if node is not None else None
    if node is str or (typing.get_origin(node) is typing.Literal and all(isinstance(a, str) for a in node.__args__)):
        return raw
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word for a key that takes no string: the model names the type it wants


# --------------------------------------------------------------------------------------------
# JSON Schema


def schema_of(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """model's JSON Schema with every definition inlined and pydantic's titles left out."""
    schema = model.model_json_schema(mode="validation")
    definitions = schema.pop("$defs", {})

    def inline(node: Any, *, names: bool = False) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            if not names and "anyOf" in node and {"type": "null"} in node["anyOf"] and len(node["anyOf"]) == 2:
                # X | None as the old hand-kept schema had it: {"type": [X, "null"]} (Helm's null unsets a key).
                (choice,) = (choice for choice in node["anyOf"] if choice != {"type": "null"})
                rest = {k: v for k, v in node.items() if k != "anyOf"}
                node = {**rest, **choice, "type": [choice["type"], "null"]} if "type" in choice else node
            if not names and isinstance(node.get("description"), str):
                node = {**node, "description": " ".join(node["description"].split())}
            return {k: inline(v, names=k == "properties") for k, v in node.items() if names or k != "title"}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)
