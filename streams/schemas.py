"""Writes the JSON Schema of every event into `schemas/` (`make schemas`); a test keeps them current."""

from __future__ import annotations

import json
from pathlib import Path

from streams.events import json_schemas

__all__ = ["render", "write"]

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def render() -> dict[str, str]:
    """File name -> exact file content."""
    return {
        f"{name}.schema.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in sorted(json_schemas().items())
    }


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    """(Re)write every schema file; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, content in render().items():
        path = directory / name
        path.write_text(content)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write():
        print(written)
