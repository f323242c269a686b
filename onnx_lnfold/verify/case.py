"""What the check holds once both models ran, for the judges (`verify.judges`) to read: the request,
both models as given and as ONNX Runtime ran them, the input sets and both models' outputs on each
(`Compared`), how the passes over both models run (`verify.passes`), the worst figures per output
so far (each judge adds its own) and the notes for the report. `Case.verdict` makes the
`Verification` from it; a judge that cannot judge it says why (`Declined`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from onnx_lnfold.feeds.sets import InputSet
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.sessions import ModelBytesOrPath
from onnx_lnfold.verify.verdict import Judgment, OutputDiff, Status, Verification, WayOut

if TYPE_CHECKING:
    from onnx_lnfold.verify.passes import Passes


@dataclass
class Compared:
    """One input set as ONNX Runtime ran it: the feeds the original accepted (as given, and as
    ONNX Runtime took them: widened for float32 shadows), both models' outputs, and the seconds
    the original took on it."""

    feeds: dict[str, np.ndarray]
    ort_feeds: dict[str, np.ndarray]
    original: dict[str, np.ndarray]
    fold: dict[str, np.ndarray]
    seconds: float = 0.0


@dataclass(frozen=True)
class Declined:
    """A judge's answer where it cannot judge the case: why, for the next judge and the report."""

    reason: str


@dataclass
class Case:
    """One check of a fold. `shadow`: the models run in ONNX Runtime as float32 shadows (bfloat16
    widened), `ort_original` and `ort_folded` the models as they ran there (shadows, random ops seeded
    alike: `verify.seeded`). `labels` name the input sets as they ran
    (another reading of the shapes may have run), `dropped` those the original ran on in no reading."""

    request: VerifyRequest
    original: ModelBytesOrPath
    folded: ModelBytesOrPath
    input_sets: list[InputSet]
    output_types: dict[str, int]
    shadow: bool = False
    ort_original: ModelBytesOrPath | None = None
    ort_folded: ModelBytesOrPath | None = None
    random_ops: bool = False  # it has random ops without a seed (`verify.seeded`)
    labels: list[str] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    compared: list[Compared] = field(default_factory=list)
    worst: dict[str, OutputDiff] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    passes: Passes | None = None  # how the passes over both models run: chosen once (`verify.ort_runs.run_both`)

    def __post_init__(self) -> None:
        self.labels = self.labels or [s.label for s in self.input_sets]

    @property
    def outputs(self) -> list[OutputDiff]:
        return list(self.worst.values())

    def where(self, number: int) -> str:
        """How the report names input set `number` (from 1)."""
        return f"input set {number} of {len(self.input_sets)} ({self.labels[number - 1]})"

    def verdict(
        self,
        status: Status,
        reason: str = "",
        *,
        judgment: Judgment | Literal[""] = "",
        judgment_reason: str = "",
        way_out: WayOut | Literal[""] = "",
    ) -> Verification:
        """The verification with the figures so far: the largest tolerance applied (`rtol`, else the
        outputs' own), the first input set's shapes, the sets that ran, the notes."""
        rtol = self.request.rtol
        used = [o.rtol for o in self.worst.values() if o.rtol is not None]
        top = rtol if rtol is not None else (max(used) if used else None)
        first = {k: list(v.shape) for k, v in self.input_sets[0].feeds.items()} if self.input_sets else {}
        ran = [label for i, label in enumerate(self.labels) if i not in self.dropped]
        how = "float32 shadows (bfloat16 widened)" if self.shadow else ""
        return Verification(
            status, reason, top, first, self.outputs, ran, how, list(self.notes), way_out, judgment, judgment_reason
        )
