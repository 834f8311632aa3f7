"""Command-line options built from a pydantic settings model, so no default is written twice.

Each field becomes one option: its type (``Literal`` and ``Enum`` types as choices, ``bool`` as
``--name`` / ``--no-name``), its description as the help, the model's default shown in the
help, a unit as the metavar (``S``, ``MS``, ``MB``, ``N``...).  An option not given leaves
the field out, so the model applies its own default; :func:`settings_values` reads back
what was given, in the model's units.  How a field reads where the naming rule is not enough
is its :class:`~tierserve.server.settings.Cli` marker.
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel

from tierserve.server.settings import Cli, cli_of


def flag_of(model: type[BaseModel], name: str) -> str:
    """The option of field ``name``: its marker's, else ``--`` + the name with ``-`` for
    ``_``, less a trailing ``_s`` (``header_timeout_s`` is ``--header-timeout``)."""
    cli = cli_of(model, name)
    return cli.flag or "--" + name.removesuffix("_s").replace("_", "-")


def _value_type(annotation: Any) -> Any:
    """The annotation without ``Annotated`` and ``| None``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(kinds) != 1:
                raise TypeError(f"no command-line option for a union {annotation!r}")
            annotation = kinds[0]
        else:
            return annotation


def _choices(kind: Any) -> list[Any] | None:
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return [member.value for member in kind]
    return None


def _metavar(name: str, kind: Any, cli: Cli) -> str | None:
    if cli.metavar:
        return cli.metavar
    if cli.scale == 1024 * 1024:
        return "MB"
    for suffix, unit in (("_ms", "MS"), ("_s", "S"), ("_us", "US")):
        if name.endswith(suffix):
            return unit
    return {int: "N", float: "X"}.get(kind)


def shown_default(model: type[BaseModel], name: str) -> str | None:
    """The field's default as the option would give it (``64`` for 64 MiB given in MiB),
    ``$VAR`` for one read from the environment, None when it has none to show."""
    field = model.model_fields[name]
    cli = cli_of(model, name)
    default = field.get_default(call_default_factory=True)
    if default is None:
        return f"${cli.env}" if cli.env else None
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, enum.Enum):
        return str(default.value)
    if isinstance(default, (int, float)):
        return f"{default / cli.scale:g}"
    return str(default)


def add_setting(
    container: Any,
    model: type[BaseModel],
    name: str,
    *,
    aliases: tuple[str, ...] = (),
    default_help: str | None = None,
) -> None:
    """Add field ``name`` of ``model`` as an option of ``container`` (a parser or a group),
    stored under the field's name; ``aliases``: more spellings of the option;
    ``default_help``: what the help says the default is, where a command has its own rule."""
    field = model.model_fields[name]
    cli = cli_of(model, name)
    kind = _value_type(field.annotation)
    if not field.description:
        raise TypeError(f"{model.__name__}.{name} has no description to show as its help")
    shown = default_help or shown_default(model, name)
    help_text = field.description.replace("%", "%%")
    if shown is not None:
        help_text += f" (default: {shown.replace('%', '%%')})"
    flags = (flag_of(model, name), *aliases)
    common = dict(dest=name, default=argparse.SUPPRESS, help=help_text)
    if kind is bool:
        container.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
        return
    target = container
    if cli.none_flag:
        target = container.add_mutually_exclusive_group()
        target.add_argument(cli.none_flag, dest=name, action="store_const", const=None,
                            default=argparse.SUPPRESS, help=cli.none_help)  # fmt: skip
    choices = _choices(kind)
    if choices is not None:
        target.add_argument(*flags, choices=choices, type=type(choices[0]), **common)
        return
    convert = float if cli.scale != 1 or kind is float else int if kind is int else str
    target.add_argument(*flags, type=convert, metavar=_metavar(name, kind, cli), **common)


def add_settings(
    parser: argparse.ArgumentParser, model: type[BaseModel], exclude: tuple[str, ...] = ()
) -> None:
    """Add every field of ``model`` but ``exclude`` as an option (:func:`add_setting`)."""
    for name in model.model_fields:
        if name not in exclude:
            add_setting(parser, model, name)


def settings_values(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``model`` that ``args`` gives, in the model's units (an option in MiB
    of a byte setting times its scale)."""
    values = {}
    for name in model.model_fields:
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        scale = cli_of(model, name).scale
        if value is not None and scale != 1:
            value = round(value * scale)
        values[name] = value
    return values
