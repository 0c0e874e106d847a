"""Writes the chart's values.schema.json, with ``config`` and ``agent.config`` from the settings models.

The chart's own values (image, replicas, resources ...) are kept by hand in values.schema.base.json;
``config`` and ``agent.config`` come from the models rasd-controller and rasd-agent load
(docs/configuration.md).

    python helm/generate_schema.py          # rewrite helm/rasd/values.schema.json (make schema)
    python helm/generate_schema.py --check  # exit 1 if the committed file is stale

A test (tests/unit/helm/test_chart.py) fails while the committed file differs from `text()`.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from rasd.agent import settings_file
from rasd.controller import config as controller_config

HELM = pathlib.Path(__file__).resolve().parent
BASE = HELM / "values.schema.base.json"
TARGET = HELM / "rasd" / "values.schema.json"


def schema() -> dict[str, Any]:
    """The base with both generated parts in the places it keeps for them."""
    values = json.loads(BASE.read_text())
    values["properties"]["config"] = controller_config.chart_config_schema()
    values["properties"]["agent"]["properties"]["config"] = settings_file.chart_config_schema()
    return values


def text() -> str:
    """`schema` as the committed file's text."""
    return json.dumps(schema(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Rewrite the committed file, or with --check say whether it is stale."""
    if argv == ["--check"]:
        if TARGET.read_text() != text():
            print(f"{TARGET} is stale: run make schema", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python helm/generate_schema.py [--check]", file=sys.stderr)
        return 2
    TARGET.write_text(text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
