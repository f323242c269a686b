"""Cost tables from measured points: the fit the rule reads (`decide.costs.CostTable`), made the same
way for every table, whether its points are callgrind's instruction counts (`python -m
benchmarks.emission_costs`, the built-in CPU table) or wall-clock microseconds (`onnx-lnfold
calibrate`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from onnx_lnfold.decide.costs import KINDS, LAYOUT_KINDS, Cost, CostTable, Point


def fit_points(points: list[Point], per_width: bool = False) -> Cost:
    """`fixed + per_token * tokens + per_element * tokens * width` (`+ per_width * width` where
    asked: the layout kinds) through `points`, least squares
    on the relative error (every shape weighs the same, 1x16 as much as 8x1024), each coefficient
    to 4 significant digits. A point whose spread exceeds its value (a noisy wall-clock difference)
    weighs by its spread instead: it says that little."""
    y = np.array([p.value for p in points], float)
    a = np.array([[1.0, p.tokens, p.tokens * p.width, *([p.width] if per_width else [])] for p in points], float)
    scale = np.maximum(np.abs(y), np.array([p.spread for p in points], float))
    w = 1.0 / np.where(scale > 0, scale, 1.0)
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    return Cost(*(float(f"{c:.4g}") for c in coef))


def make_table(
    points: dict[str, list[Point]], *, provider: str, unit: str, source: str, measured_by: str = "", onnxruntime: str = ""
) -> CostTable:
    missing = [k for k in KINDS if not points.get(k)]
    if missing:
        raise ValueError(f"no measured points for {', '.join(missing)}")
    kinds = [*KINDS, *(k for k in LAYOUT_KINDS if len(points.get(k) or ()) >= 4)]  # a fit of 4 needs 4 shapes
    return CostTable(
        provider=provider,
        unit=unit,
        costs={k: fit_points(points[k], per_width=k in LAYOUT_KINDS) for k in kinds},
        points={k: tuple(sorted(points[k], key=lambda p: (p.width, p.tokens))) for k in kinds},
        source=source,
        measured_by=measured_by,
        onnxruntime=onnxruntime,
    )


# The key that marks a table measured as a rehearsal (`calibrate --quick`): too few shapes and
# rounds to fold by. `--costs` reads such a table, and warns (`rehearsal_of`).
REHEARSAL = "rehearsal"


def write_table(table: CostTable, path: str | Path, rehearsal: str | None = None) -> None:
    """The table as JSON, one measured point a line; `rehearsal`: why it is not a table to fold
    by, written in the table under `REHEARSAL`."""
    data = table.to_dict()
    if rehearsal:
        data = {"format": data.pop("format"), REHEARSAL: rehearsal, **data}
    text = json.dumps(data, indent=1)
    text = re.sub(r"\[\s+([-0-9.e+]+),\s+([-0-9.e+]+),\s+([-0-9.e+]+),\s+([-0-9.e+]+)\s+\]", r"[\1, \2, \3, \4]", text)
    Path(path).write_text(text + "\n")


def fit_error(table: CostTable, kind: str) -> float:
    """The largest relative error of the fit over the kind's measured points."""
    cost = table.costs[kind]
    return max((abs(cost.at(p.tokens, p.width) - p.value) / abs(p.value) for p in table.points[kind] if p.value), default=0.0)


def rehearsal_of(path: str | Path) -> str | None:
    """What marks the table at `path` as a rehearsal (`write_table`), or None for a table to fold by
    (the file was read as a table already: `decide.costs.load_table`)."""
    try:
        marked = json.loads(Path(path).read_text()).get(REHEARSAL)
    except (OSError, ValueError, AttributeError):
        return None
    return str(marked) if marked else None
