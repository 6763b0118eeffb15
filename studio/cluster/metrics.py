"""Every replica's Prometheus text as one exposition: each sample gains a ``replica`` label, each
metric family keeps one HELP/TYPE header, and the cluster adds gauges of its own."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _with_label(line: str, name: str, value: str) -> str | None:
    match = _SAMPLE.match(line)
    if match is None:
        return None
    metric, labels, number, stamp = match.groups()
    pair = f'{name}="{_escape(value)}"'
    inner = labels[1:-1].rstrip(",") if labels else ""
    return f"{metric}{{{inner + ',' if inner else ''}{pair}}} {number}{stamp or ''}"


def _family(sample_name: str, families: Mapping[str, object]) -> str:
    if sample_name in families:
        return sample_name
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in families:
            return sample_name[: -len(suffix)]
    return sample_name


def merge_expositions(texts: Mapping[str, str], label: str = "replica") -> str:
    """Prometheus texts keyed by replica -> one text; samples grouped by family, headers once."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for replica, text in texts.items():
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = headers.setdefault(parts[2], [])
                    samples.setdefault(parts[2], [])
                    if not any(h.split(None, 2)[1] == parts[1] for h in family):
                        family.append(line)
                continue
            labelled = _with_label(line, label, replica)
            if labelled is None:
                continue
            family_name = _family(labelled.split("{", 1)[0], headers)
            headers.setdefault(family_name, [])
            samples.setdefault(family_name, []).append(labelled)
    out: list[str] = []
    for name, lines in samples.items():
        out.extend(headers.get(name, []))
        out.extend(lines)
    return "\n".join(out) + ("\n" if out else "")


def gauge(name: str, help_text: str, values: Iterable[tuple[Mapping[str, str], float]]) -> str:
    """One gauge family in the text format."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, value in values:
        inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        number = str(int(value)) if float(value).is_integer() else repr(float(value))
        lines.append(f"{name}{{{inner}}} {number}" if inner else f"{name} {number}")
    return "\n".join(lines) + "\n"
