"""The fold as an Olive pass (`pip install 'onnx_lnfold[olive]'`), for Olive workflows.

Olive resolves a pass by its type name in a package config; `package_config()` is Olive's own
with `OnnxLnFold` added, so a workflow names it like any built-in pass::

    from olive.workflows import run as olive_run
    from onnx_lnfold.olive import package_config

    olive_run({
        "input_model": {"type": "ONNXModel", "model_path": "gpt2.onnx"},
        "passes": {
            "optimize": {"type": "OrtTransformersOptimization", "model_type": "gpt2"},
            "lnfold": {"type": "OnnxLnFold"},
            "fp16": {"type": "OnnxFloatToFloat16", "keep_io_types": True},
        },
        "output_dir": "out",
    }, package_config=package_config())

Put it after `OrtTransformersOptimization` and before `OnnxFloatToFloat16` or quantization: the
order docs/PIPELINES.md measured. Each run verifies the folded model in ONNX
Runtime (unless `verify` is false) and fails the pass, writing nothing, when it differs. Its
config holds the fold's and the check's options (`core.options.OLIVE_OPTIONS`: the command line's,
with the same defaults and help; all but `inputs`, arrays a config cannot hold).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from olive.hardware.accelerator import AcceleratorSpec
from olive.model import ONNXModelHandler
from olive.model.utils import resolve_onnx_path
from olive.package_config import OlivePackageConfig
from olive.passes import Pass
from olive.passes.pass_config import BasePassConfig, PassConfigParam

from onnx_lnfold._api import fold
from onnx_lnfold.core.options import OLIVE_OPTIONS, fold_keywords

logger = logging.getLogger(__name__)

PASS_TYPE = "OnnxLnFold"


class OnnxLnFold(Pass):
    """Fold LayerNormalization into RMSNorm wherever that is exact (onnx_lnfold.fold)."""

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        return {
            option.name: PassConfigParam(type_=option.kind, default_value=option.default, description=option.help)
            for option in OLIVE_OPTIONS
        }

    def _run_for_config(
        self, model: ONNXModelHandler, config: type[BasePassConfig], output_model_path: str
    ) -> ONNXModelHandler:
        output_model_path = resolve_onnx_path(output_model_path, Path(model.model_path).name)
        result = fold(model.model_path, output=output_model_path, **fold_keywords(config))
        for line in result.report.format_text().splitlines():
            logger.info(line)
        return ONNXModelHandler(model_path=output_model_path)


def package_config() -> dict[str, Any]:
    """Olive's default package config with `OnnxLnFold` registered, for `olive.workflows.run`."""
    config = json.loads(Path(OlivePackageConfig.get_default_config_path()).read_text())
    config["passes"][PASS_TYPE] = {
        "module_path": f"{__name__}.{OnnxLnFold.__name__}",
        "supported_providers": ["*"],
        "supported_accelerators": ["*"],
        "supported_precisions": ["*"],
        "supported_algorithms": [],
        "supported_quantization_encodings": [],
        "module_dependencies": ["onnxruntime"],
    }
    return config
