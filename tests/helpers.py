"""Shared by the tests that run the CLI, build external-data models or need a wrong fold to refuse."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import onnx
import onnx_ir as ir

from onnx_lnfold import _pipeline

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("make_large_model", ROOT / "models" / "make" / "make_large_model.py")
make_large_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_large_model)  # type: ignore[union-attr]


def run_cli(*args, cwd=None) -> tuple[int, str, str]:
    """`python -m onnx_lnfold ARGS` in a subprocess: exit code, stdout, stderr as a user sees them."""
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def relocate_external_data(model_path, location: str, tensor: str | None = None) -> None:
    """Point the external data of one tensor (`tensor`), or of every tensor, at `location`."""
    proto = onnx.load(model_path, load_external_data=False)
    for init in proto.graph.initializer:
        if tensor is None or init.name == tensor:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = location
    onnx.save(proto, model_path)


def fold_with_a_wrong_epsilon(monkeypatch) -> None:
    """Make every fold write its RMSNorms with epsilon 1.0: a wrong fold the checks must refuse."""
    original = _pipeline.apply_plan

    def broken(model, plan):
        original(model, plan)
        for node in model.graph:
            if node.op_type == "SimplifiedLayerNormalization":
                node.attributes["epsilon"] = ir.AttrFloat32("epsilon", 1.0)

    monkeypatch.setattr(_pipeline, "apply_plan", broken)
