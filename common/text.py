r"""Text that others wrote, made safe to print on a terminal or in a log line.

Event messages, attributes, hostnames, labels, certificate names and the reasons of refused calls
come from nodes and callers. Printed as they are, an ESC sequence moves the cursor, recolours or
clears the operator's terminal, a CR or LF forges a line (a row of ``rasctl audit``, a log
record), a BEL rings, and a bidirectional override (U+202E) makes what is read differ from what
is stored. `printable` escapes each of those as Python would (``\x1b``, ``\n``, ``\u202e``); all
other text, any language's included, is left as it is. JSON output needs none of this: JSON
escapes control characters itself and cannot span lines.

`echoed` is how an error names a value a caller sent: quoted, escaped and cut to a few dozen
characters, so that a detail never carries a caller's megabytes (or terminal controls) back out.
"""

from __future__ import annotations

import re

_UNSAFE_RE = re.compile(
    "["
    "\x00-\x1f\x7f-\x9f"  # C0 and C1 controls: ESC, CR, LF, BEL, TAB, CSI (0x9b) ...
    "\u061c\u200e\u200f"  # bidirectional marks (Arabic letter mark, LRM, RLM)
    "\u2028\u2029"  # line and paragraph separators: a line break to some terminals and viewers
    "\u202a-\u202e\u2066-\u2069"  # bidirectional embeddings, overrides and isolates
    "]"
)


def printable(value: str, *, keep_newlines: bool = False) -> str:
    r"""value with every control character, line break and bidirectional control escaped (``\x1b``, ``\u202e``).

    keep_newlines: leave LF as it is (a traceback of our own, printed over several lines).
    """
    if keep_newlines:
        return "\n".join(_UNSAFE_RE.sub(_escaped, line) for line in value.split("\n"))
    return _UNSAFE_RE.sub(_escaped, value)


ECHO_MAX_CHARS = 80
"""How much of a caller's value an error detail or log line repeats (`echoed`)."""


def echoed(value: object, max_chars: int = ECHO_MAX_CHARS) -> str:
    r"""A caller's value as an error names it: quoted like repr, escaped (`printable`), cut to max_chars.

    A longer value keeps its first max_chars characters and says how long it was:
    ``'xxxx'... (4,096 characters)``. Every error detail that repeats a request field goes through
    this; before, details echoed node ids, RMA ids and power domains whole.
    """
    text = value if isinstance(value, str) else str(value)
    shown = printable(repr(text[:max_chars]))
    if len(text) <= max_chars:
        return shown
    return f"{shown}... ({len(text):,} characters)"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code in _SHORT:
        return _SHORT[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_SHORT = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
