"""`rasd.common.text.echoed`: how an error names a caller's value (issue #37 item 18)."""

from __future__ import annotations

from rasd.common.text import ECHO_MAX_CHARS, echoed


def test_a_short_value_is_quoted_as_repr_would():
    assert echoed("node-7") == "'node-7'"
    assert echoed(3.5) == "'3.5'"


def test_a_long_value_is_cut_and_says_how_long_it_was():
    shown = echoed("x" * 5000)
    assert shown == "'" + "x" * ECHO_MAX_CHARS + "'... (5,000 characters)"
    assert echoed("abcdef", 3) == "'abc'... (6 characters)"


def test_terminal_controls_and_bidirectional_overrides_are_escaped():
    shown = echoed("\x1b[2J\r\nforged\u202e\x07")
    assert shown == "'\\x1b[2J\\r\\nforged\\u202e\\x07'"
    assert all(ch.isprintable() for ch in shown)
