"""The ``tierserve serve`` options are the server settings: every field of ``Settings`` is an
option whose default is the field's when not given, and whose value arrives unchanged in
the settings object when given (walked over the fields, not a hand-written list)."""

from __future__ import annotations

import argparse
import enum
import re
import typing
from pathlib import Path

import pytest

from tierserve.clients.cli import build_parser
from tierserve.clients.demo import demo_settings
from tierserve.clients.serve import SOURCE, settings_from_args
from tierserve.clients.settings_options import _choices, _value_type, flag_of, shown_default
from tierserve.server.settings import Settings, cli_of

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(autouse=True)
def _no_token_in_the_environment(monkeypatch):
    monkeypatch.delenv("TIERSERVE_ADMIN_TOKEN", raising=False)


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def _default(name: str):
    return Settings.model_fields[name].get_default(call_default_factory=True)


def _other_value(name: str):
    """A valid value of setting ``name`` other than its default, with a fraction where the
    option takes one (a fraction lost on the way would show)."""
    kind = _value_type(Settings.model_fields[name].annotation)
    default, scale = _default(name), cli_of(Settings, name).scale
    choices = _choices(kind)
    if kind is bool:
        return not default
    if choices is not None:
        return next(c for c in choices if c != default)
    if kind is int and scale != 1:
        return default + scale // 2  # 64.5 MiB
    if kind is int:
        return 7 if default is None else default + 3
    if kind is float:
        return default + 0.5
    if kind is Path:
        return Path("elsewhere")
    assert kind is str, (name, kind)
    return "127.0.0.2" if name == "host" else "s3cret"


def _argv(name: str, value) -> list[str]:
    flag = flag_of(Settings, name)
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag.removeprefix("--")]
    scale = cli_of(Settings, name).scale
    return [flag, f"{value / scale:g}" if scale != 1 else str(value)]


def _serve(*argv: str) -> Settings:
    source = [] if any(a in ("--model-repository", "--config") for a in argv) else [
        "--model-repository", "r"]  # fmt: skip
    return settings_from_args(build_parser().parse_args(["serve", *source, *argv]))


def test_every_setting_not_given_has_the_models_default():
    settings = _serve()
    for name in Settings.model_fields:
        expected = Path("r") if name == "model_repository" else _default(name)
        assert getattr(settings, name) == expected, name
    assert settings == Settings.build(model_repository="r")


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_given_arrives_unchanged(name):
    value = _other_value(name)
    assert value != _default(name)
    settings = _serve(*_argv(name, value))
    assert getattr(settings, name) == value, (name, _argv(name, value))
    assert type(getattr(settings, name)) is type(value)
    others = {n for n in Settings.model_fields if getattr(settings, n) != _default(n)}
    assert others - {name, "model_repository"} == set(), "another setting changed too"


def test_a_setting_that_can_be_none_has_an_option_for_it():
    nullable = [n for n in Settings.model_fields if cli_of(Settings, n).none_flag]
    assert nullable == ["grpc_port"]
    assert _serve("--no-grpc").grpc_port is None
    with pytest.raises(SystemExit):  # one or the other
        _serve("--no-grpc", "--grpc-port", "9")


def test_the_help_is_the_fields_description_and_default():
    serve = _subparser("serve")
    actions = {a.dest: a for a in serve._actions}
    for name, field in Settings.model_fields.items():
        action = actions[name]
        assert flag_of(Settings, name) in action.option_strings
        assert field.description, f"{name} has no description"
        help_text = action.help % {}  # what argparse prints (``%%`` as ``%``)
        assert help_text.startswith(field.description), name
        shown = shown_default(Settings, name)
        if shown is not None:
            assert help_text.endswith(f"(default: {shown})"), name
        kind = _value_type(field.annotation)
        if _choices(kind) is not None:
            assert list(action.choices) == _choices(kind), name
    assert actions["header_timeout_s"].metavar == "S"
    assert actions["max_request_bytes"].metavar == "MB"
    assert shown_default(Settings, "max_request_bytes") == "64"
    assert shown_default(Settings, "admin_token") == "$TIERSERVE_ADMIN_TOKEN"
    serve.format_help()  # every help string formats (a bare % would raise here)


def test_the_source_is_one_of_two_settings():
    assert set(SOURCE) <= set(Settings.model_fields)
    assert _serve("--config", "ps.json").config == Path("ps.json")
    for argv in ([], ["--model-repository", "r", "--config", "ps.json"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *argv])


def test_a_setting_with_an_environment_variable_reads_it(monkeypatch):
    with_env = {n: cli_of(Settings, n).env for n in Settings.model_fields if cli_of(Settings, n).env}
    assert with_env == {"admin_token": "TIERSERVE_ADMIN_TOKEN"}
    monkeypatch.setenv("TIERSERVE_ADMIN_TOKEN", "from-env")
    assert _serve().admin_token == "from-env"
    assert _serve("--admin-token", "given").admin_token == "given"


def test_the_demo_takes_its_ports_from_the_settings():
    demo = _subparser("demo")

    def settings(*argv):
        return demo_settings(demo.parse_args(list(argv)), Path("repo"))

    default = settings()
    assert (default.host, default.http_port) == (_default("host"), _default("http_port"))
    assert default.grpc_port == _default("http_port") + 1
    assert (settings("--port", "9000").http_port, settings("--port", "9000").grpc_port) == (
        9000, 9001)  # fmt: skip
    assert settings("--http-port", "9000", "--grpc-port", "7").grpc_port == 7
    assert settings("--no-grpc").grpc_port is None


_UNITS = {"MiB": 1024 * 1024, "s": 1, "": 1}


def _operations_table() -> list[tuple[str, str, str]]:
    rows = re.findall(r"^\| `(\w+)` \(`(--[\w-]+)`\) \| ([^|]+) \|", (DOCS / "operations.md")
                      .read_text(), re.MULTILINE)  # fmt: skip
    assert len(rows) >= 10, "the table of docs/operations.md was not found"
    return rows


@pytest.mark.parametrize("row", _operations_table(), ids=lambda r: r[0])
def test_docs_operations_table_states_the_settings(row):
    name, flag, stated = row
    assert name in Settings.model_fields
    assert flag == flag_of(Settings, name)
    number, unit = re.fullmatch(r"([\d.]+) ?(MiB|s|)", stated.strip()).groups()
    default = _default(name)
    assert float(number) * _UNITS[unit] == default, (name, stated, default)
    if unit == "s":
        assert name.endswith("_s")


def test_a_literal_or_enum_setting_becomes_choices():
    class Color(enum.Enum):
        red = "red"
        blue = "blue"

    assert _choices(Color) == ["red", "blue"]
    assert _choices(typing.Literal["a", "b"]) == ["a", "b"]
    assert _choices(int) is None


#: Options the docs name that belong to other programs (perf_analyzer, docker compose), or
#: stand for any.
_NOT_OURS = {"--concurrency-range", "--input-data", "--profile", "--name", "--no-name"}


def test_every_option_the_serving_docs_name_exists():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    ours = {flag for sub in subparsers.choices.values() for a in sub._actions
            for flag in a.option_strings}  # fmt: skip
    for doc in ("serving.md", "operations.md", "deployment.md"):
        spans = re.findall(r"`([^`]*)`", (DOCS / doc).read_text())
        named = {f for span in spans for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span)}
        assert named - ours - _NOT_OURS == set(), doc
