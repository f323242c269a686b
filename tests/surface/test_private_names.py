"""No module of the package reads another module's private names: what one step hands the next
is public (the plan as plain data, the bound plan's IR objects as fields of their own), so a
module can change its private names without breaking another."""

import importlib.util
from pathlib import Path

import onnx_lnfold

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("structure_metrics", ROOT / "tools" / "structure_metrics.py")
structure_metrics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(structure_metrics)  # type: ignore[union-attr]


def test_no_module_reads_another_modules_private_names():
    package = Path(onnx_lnfold.__file__).parent  # the installed package where CI tests the wheel
    assert (package / "analysis" / "plan.py").is_file()
    across, _ = structure_metrics.private_reads(package)
    assert across == []


def test_a_private_read_across_modules_is_caught(tmp_path):
    """Attribute reads and imports of another module's private names are caught; a module's own
    private names, `self._x`, the private driver modules and other libraries' names are not."""
    package = tmp_path / "onnx_lnfold"
    (package / "analysis").mkdir(parents=True)
    (package / "analysis" / "plan.py").write_text(
        "class Edit:\n    def __init__(self, value):\n        self._value = value\n\n\ndef _helper():\n    return 1\n"
    )
    (package / "apply").mkdir()
    (package / "apply" / "apply_plan.py").write_text(
        "from onnx_lnfold.analysis.plan import _helper\n"
        "from onnx_lnfold import _pipeline\n\n\n"
        "def apply(edit, inference):\n"
        "    inference._infer_impl()\n"
        "    return edit._value, _helper(), _pipeline\n"
    )
    (package / "_pipeline.py").write_text("class Run:\n    def go(self):\n        return self._steps\n")
    across, foreign = structure_metrics.private_reads(package)
    assert across == [
        "apply/apply_plan.py:1 onnx_lnfold.analysis.plan._helper",
        "apply/apply_plan.py:7 ._value",
    ]
    assert foreign == ["apply/apply_plan.py:6 ._infer_impl"]
