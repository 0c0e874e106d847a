"""``rasctl completion bash|zsh``: a completion script generated from rasctl's own parser.

The script holds, for every command path ("", "get", "get events", ...), the words that may follow
it (sub-commands, or the command's flags), and completes the current word from the entry of the
longest path the line has typed. zsh runs the same function through its bash compatibility.
"""

from __future__ import annotations

import argparse
import shlex


def _words(parser: argparse.ArgumentParser, path: str, table: dict[str, list[str]]) -> None:
    """table[path]: the sub-commands (as shown in --help) and flags of parser; the same for each sub-command."""
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            shown = {choice.dest for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if name in shown:
                    words.append(name)
                _words(sub, f"{path} {name}".strip(), table)
        elif action.option_strings and action.help is not argparse.SUPPRESS:
            words.extend(action.option_strings)
        elif action.choices and not action.option_strings:
            words.extend(str(c) for c in action.choices)
    table[path] = words


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for shell ("bash" or "zsh"), to be sourced."""
    table: dict[str, list[str]] = {}
    _words(parser, "", table)
    cases = "\n".join(
        f"        {shlex.quote(path or '_')}) words={shlex.quote(' '.join(words))} ;;"
        for path, words in sorted(table.items())
    )
    body = f"""_rasctl() {{
    local cur path candidate word words=""
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    path="_"
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$word" in -*) continue ;; esac
        if [ "$path" = "_" ]; then candidate="$word"; else candidate="$path $word"; fi
        _rasctl_known "$candidate" && path="$candidate"
    done
    case "$path" in
{cases}
    esac
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
}}
_rasctl_known() {{
    case "$1" in
{chr(10).join(f"        {shlex.quote(path)}) return 0 ;;" for path in sorted(table) if path)}
    esac
    return 1
}}
complete -F _rasctl rasctl
"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + body
    return body
