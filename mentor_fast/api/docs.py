"""The TRL-to-ours table of docs/python_api.md, from TRL_FIELDS: `python -m mentor_fast.api.docs`."""

from __future__ import annotations

from mentor_fast.api.config import NEUTRAL, TRL_FIELDS


def table_markdown() -> str:
    rows = ["| TRL's GRPOConfig | mentor_fast | note |", "|---|---|---|"]
    rows += [f"| `{f.name}` | `{f.ours}` | {f.note} |" for f in TRL_FIELDS]
    neutral = ", ".join(f"`{k}={v[0]!r}`" for k, v in NEUTRAL.items())
    return "\n".join(rows) + f"\n\nAccepted at the value that changes nothing, refused otherwise: {neutral}.\n"


if __name__ == "__main__":
    print(table_markdown(), end="")
