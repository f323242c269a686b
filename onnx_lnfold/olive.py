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
order README "Deployment pipelines" measured. Each run verifies the folded model in ONNX
Runtime (unless `verify` is false) and fails the pass, writing nothing, when it differs.
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
from onnx_lnfold.core.ops import target_help
from onnx_lnfold.core.options import OPTION_NAMES, FoldOptions

logger = logging.getLogger(__name__)

PASS_TYPE = "OnnxLnFold"
_DEFAULTS = FoldOptions()


class OnnxLnFold(Pass):
    """Fold LayerNormalization into RMSNorm wherever that is exact (onnx_lnfold.fold)."""

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        return {
            "target": PassConfigParam(
                type_=str, default_value=_DEFAULTS.target, description=target_help()
            ),
            "fuse_residual": PassConfigParam(
                type_=str, default_value=_DEFAULTS.fuse_residual, description="which residual Adds become SkipSimplifiedLayerNormalization: auto, always, never"
            ),
            "tied_weights": PassConfigParam(
                type_=str, default_value=_DEFAULTS.tied_weights, description="a tied embedding table: auto, center (x - ReduceMean(x)), untie (a centered copy), derive (table - row means, folded by ONNX Runtime at load)"
            ),
            "auxiliary_centering": PassConfigParam(
                type_=bool, default_value=_DEFAULTS.auxiliary_centering, description="allow an explicit x - ReduceMean(x) where no weight edit centers a stream"
            ),
            "keep_ort_fusions": PassConfigParam(
                type_=bool,
                default_value=_DEFAULTS.keep_ort_fusions,
                description="keep the LNs whose fold would cost an ONNX Runtime fusion (checked with ONNX Runtime on weightless copies)",
            ),
            "fold_costly": PassConfigParam(
                type_=bool, default_value=_DEFAULTS.fold_costly, description="also fold the LNs whose fold costs ONNX Runtime's CPU EP more than the LN"
            ),
            "costs": PassConfigParam(
                type_=str, default_value=_DEFAULTS.costs, description="a cost table (onnx-lnfold calibrate -o costs.json) to decide what pays by; default: the built-in CPU one"
            ),
            "verify": PassConfigParam(
                type_=bool, default_value=True, description="check the folded model against the input in ONNX Runtime"
            ),
        }

    def _run_for_config(
        self, model: ONNXModelHandler, config: type[BasePassConfig], output_model_path: str
    ) -> ONNXModelHandler:
        output_model_path = resolve_onnx_path(output_model_path, Path(model.model_path).name)
        options = FoldOptions(**{name: getattr(config, name) for name in OPTION_NAMES})
        result = fold(model.model_path, verify=config.verify, options=options)
        for line in result.report.format_text().splitlines():
            logger.info(line)
        result.save(output_model_path)
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
