"""rasctl's contexts file: named controllers with their certificates and token, one of them current.

The file is ``$RASCTL_CONFIG``, else ``$XDG_CONFIG_HOME/rasd/rasctl.toml`` (``~/.config/rasd/rasctl.toml``)::

    current-context = "prod"

    [contexts.prod]
    controller = "rasd.example.net:7443"
    tls-ca = "/etc/rasd/ca.crt"
    tls-cert = "~/.config/rasd/me.crt"
    tls-key = "~/.config/rasd/me.key"
    tls-server-name = ""   # optional
    token = ""             # optional; a bearer token

A flag wins over the environment ($RASD_CONTROLLER, $RASD_TLS_*, $RASD_TOKEN), which wins over the
context (``--context NAME``, else the file's current-context), which wins over the defaults
(127.0.0.1:7443, plaintext). ``rasctl config use-context NAME`` rewrites only the current-context
line, so comments and the rest of the file stay as written.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import tomllib
from typing import Any, TextIO

DEFAULT_CONTROLLER = "127.0.0.1:7443"
DEFAULT_TIMEOUT_S = 10.0
KEYS = ("controller", "tls-ca", "tls-cert", "tls-key", "tls-server-name", "token")
"""What a context may hold; each is the global flag of the same name."""
_ENV = {
    "controller": "RASD_CONTROLLER",
    "tls-ca": "RASD_TLS_CA",
    "tls-cert": "RASD_TLS_CERT",
    "tls-key": "RASD_TLS_KEY",
    "tls-server-name": "RASD_TLS_SERVER_NAME",
    "token": "RASD_TOKEN",
}
_PATH_KEYS = frozenset({"tls-ca", "tls-cert", "tls-key"})
_CURRENT = re.compile(r"^\s*current-context\s*=.*$", re.MULTILINE)


def path() -> pathlib.Path:
    """Where the contexts file is (module docstring); it need not exist."""
    if os.environ.get("RASCTL_CONFIG"):
        return pathlib.Path(os.environ["RASCTL_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(pathlib.Path.home() / ".config")
    return pathlib.Path(base) / "rasd" / "rasctl.toml"


def load(file: pathlib.Path) -> dict[str, Any]:
    """The file's contents ({} when there is none).

    Raises:
        ValueError: not TOML, or a context that is not a table, has a key rasctl does not know or a
            value that is not a string.
    """
    try:
        text = file.read_text()
    except FileNotFoundError:
        return {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{file}: not TOML: {exc}") from None
    for name, context in data.get("contexts", {}).items():
        if not isinstance(context, dict):
            raise ValueError(f"{file}: contexts.{name} is not a table")
        unknown = sorted(set(context) - set(KEYS))
        if unknown:
            raise ValueError(f"{file}: contexts.{name}.{unknown[0]}: unknown key; known: {', '.join(KEYS)}")
        for key, value in context.items():
            if not isinstance(value, str):
                raise ValueError(f"{file}: contexts.{name}.{key}: a string, got {value!r}")
    return data


def settle(args: argparse.Namespace) -> None:
    """Fill the global flags left unset from the environment, the context, then the defaults.

    Raises:
        ValueError: --context names a context the file does not have, or the file is bad (`load`).
    """
    file = path()
    data = load(file)
    name = args.context or data.get("current-context", "")
    context: dict[str, Any] = {}
    if name:
        context = data.get("contexts", {}).get(name)
        if context is None:
            known = ", ".join(sorted(data.get("contexts", {}))) or "none"
            raise ValueError(f"context {name!r} is not in {file} (contexts: {known})")
    for key in KEYS:
        attribute = key.replace("-", "_")
        if getattr(args, attribute, None) is not None:
            continue
        value = os.environ.get(_ENV[key]) or context.get(key)
        if value and key in _PATH_KEYS:
            value = str(pathlib.Path(value).expanduser())
        setattr(args, attribute, value)
    args.controller = args.controller or DEFAULT_CONTROLLER
    args.tls_server_name = args.tls_server_name or ""
    args.watch_timeout_s = args.timeout_s  # a --watch streams until interrupted, or for --timeout-s when given
    args.timeout_s = DEFAULT_TIMEOUT_S if args.timeout_s is None else args.timeout_s


def run(args: argparse.Namespace, out: TextIO) -> None:
    """``config get-contexts|use-context|current-context``.

    Raises:
        ValueError: use-context with a name the file does not have.
    """
    file = path()
    data = load(file)
    current = data.get("current-context", "")
    names = sorted(data.get("contexts", {}))
    if args.config_command == "current-context":
        if not current:
            raise ValueError(f"no current-context in {file}")
        print(current, file=out)
    elif args.config_command == "get-contexts":
        rows = [["*" if n == current else "", n, data["contexts"][n].get("controller", DEFAULT_CONTROLLER),
                 _auth(data["contexts"][n])] for n in names]  # fmt: skip
        from rasd.cli import output

        output.table(["CURRENT", "NAME", "CONTROLLER", "AUTH"], rows, out)
    else:
        if args.name not in names:
            raise ValueError(f"context {args.name!r} is not in {file} (contexts: {', '.join(names) or 'none'})")
        line = f"current-context = {json.dumps(args.name)}"  # a JSON string is a TOML basic string
        text = file.read_text()
        text = _CURRENT.sub(line, text, count=1) if _CURRENT.search(text) else f"{line}\n{text}"
        file.write_text(text)
        print(f"switched to context {args.name!r}", file=out)


def _auth(context: dict[str, Any]) -> str:
    parts = ["mtls" if context.get("tls-cert") else "plaintext"]
    if context.get("token"):
        parts.append("token")
    return "+".join(parts)
