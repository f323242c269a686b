"""The fusion-cost rule (docs/DESIGN.md section 10): the LNs whose fold would cost an ONNX Runtime
fusion stay LNs, and what ONNX Runtime did is the reason. Every claim comes from ONNX Runtime's
own code, run on weightless copies of the graph (`ort_fusions.weightless`, `ort_fusions.probe`); the structural
pre-filters here only skip running it on graphs where it has nothing to find.
`FusionCheck.settle` makes the plan (as the analysis's `Planner` makes it) until it costs no fusion.

- **EmbedLayerNormalization** (`embed_layer_norm_costs`): the transformers optimizer
  (`optimize_model`, model_type bert and bart, opt levels 0 and 1) fuses the word, position and
  token-type Gathers, their sum and the embeddings LN into one node, which has no RMS form.
  An LN it fuses on a weightless copy of this graph is kept (code `fusion-cost`); the node names
  the LN by its gamma and beta inputs. Pre-filter: an LN whose input sums at least two Gathers of
  constant tables (the parent paths the optimizer's matcher starts from).
- **Session fusions** (`session_fusion_costs`): an inference session (ORT_ENABLE_ALL, CPU) on a
  weightless copy of the original and of the folded graph; a fused node of the original's
  optimized graph that the folded one does not have (its outputs are made by no fused node there)
  is lost, and the LNs whose edits, explicit centerings or rewrites touch its pattern are kept
  (code `fusion-lost`) and the plan made again, until nothing is lost. The fold's own changes
  are discounted: LayerNormalization and SkipLayerNormalization becoming the RMS ops.
- **Reshape -> Gemm -> Reshape** (`gemm_order`): the gpt2 optimizer's postprocess turns it
  into MatMul + Add behind a LayerNormalization; the folds still pay where that optimizer never
  runs, so nothing is kept: the report advises the order instead (`ort_fusions.order`), with ORT's
  node counts of both orders. Pre-filter: a folded LN feeding `Reshape -> Gemm`.
- **Optimizer first** (`optimizer_first`): the plan of the optimizer's output (model_type
  bert, opt_level 0), its tensors rebound to this model's (`ort_fusions.optimizer_first`); where
  more LNs fold there than here, the report advises running it first, with both counts. Only
  where an LN is kept for its cost and the graph holds no ONNX Runtime contrib op yet.

With `keep_ort_fusions=False` nothing runs and nothing is kept for a fusion. Without onnxruntime,
or where ONNX Runtime fails on the copy, nothing is kept either, and the report's advice says that
nothing was checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.analysis.planner import Planner
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import is_standard, weight_bytes
from onnx_lnfold.core.names import display_names
from onnx_lnfold.core.ops import EMBED_LAYER_NORM, NORM_OPS
from onnx_lnfold.decide.costs import OrtLayout
from onnx_lnfold.forms import LnCandidate, LnKind
from onnx_lnfold.ort_fusions.optimizer_first import already_optimized, rebound
from onnx_lnfold.ort_fusions.probe import (
    CHILD_ABOVE_BYTES,
    OptimizerProcess,
    TransformersOptimizer,
    ort_version,
    session_graph,
)
from onnx_lnfold.ort_fusions.session_layout import decomposed_layouts, moved_centerings
from onnx_lnfold.ort_fusions.weightless import WeightlessFolder, clone_model, weightless_clone

logger = logging.getLogger(__name__)

OPTIMIZER = "onnxruntime.transformers.optimizer.optimize_model"

# The transformers optimizer's runs that can fuse EmbedLayerNormalization, cheapest first: the
# BERT and BART optimizer classes differ in their attention fusions, which the embedding fusion
# looks for under the LN; opt_level 1 first runs an ONNX Runtime session (constant folding).
EMBED_RUNS = (("bert", 0), ("bert", 1), ("bart", 0), ("bart", 1))
GEMM_RUN = ("gpt2", 0)
# The run whose output the optimizer-first count analyzes: the first of EMBED_RUNS, whose result
# the cache then holds. On the committed models and the TorchScript ELECTRA and GPT-Neo exports the
# gpt2 optimizer folded no more than bert's anywhere (and failed on one, OPT post-LN), and opt
# level 1 no more than 0.
OPTIMIZER_FIRST_RUN = EMBED_RUNS[0]

# Ops of ONNX Runtime's optimized graph that are not fusions to keep: the normalizations the fold
# replaces on purpose, and layout or copy nodes.
_NOT_FUSIONS = frozenset(
    {op.op_type for op in NORM_OPS if not op.embed} | {"ReorderInput", "ReorderOutput", "MemcpyToHost", "MemcpyFromHost"}
)
_STANDARD = ("", "ai.onnx")

# Results of ONNX Runtime on one weightless file, by the file's bytes: folding the same graph
# again (tests, a dry run then the fold) does not run ONNX Runtime again.
_CACHE: dict[tuple, object] = {}


def clear_cache() -> None:
    """Forget every result: the next check runs ONNX Runtime again."""
    _CACHE.clear()
_CACHE_SIZE = 64


def _cached(key: tuple, compute: Callable[[], object]) -> object:
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = compute()
    return _CACHE[key]


# --------------------------------------------------------------------------- pre-filters


def _constant(value: ir.Value | None) -> ir.TensorProtocol | None:
    """A true constant's tensor, looked at without `onnx_ir.convenience.get_const_tensor` (which
    names the tensor it returns and may rewrite the value's shape: the check must change nothing)."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None:
        return value.const_value
    node = value.producer()
    if node is None or node.op_type != "Constant" or not is_standard(node) or len(node.attributes) != 1:
        return None
    ((key, attr),) = node.attributes.items()
    if attr.is_ref():
        return None
    if key == "value":
        return attr.value
    if key in ("value_int", "value_ints"):
        return ir.Tensor(np.array(attr.value, dtype=np.int64))
    return None


def _ints(value: ir.Value | None) -> list[int] | None:
    tensor = _constant(value)
    if tensor is None or tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    return [int(v) for v in np.asarray(tensor.numpy()).reshape(-1)]


def _add_leaves(value: ir.Value, depth: int = 2) -> list[ir.Value]:
    """The addends of a sum `Add(Add(a, b), c)`, `Add(a, b)`, ... up to `depth` Adds deep."""
    node = value.producer()
    if node is None or node.op_type != "Add" or not is_standard(node) or depth == 0:
        return [value]
    leaves: list[ir.Value] = []
    for inp in node.inputs:
        if inp is None:
            return [value]
        leaves.extend(_add_leaves(inp, depth - 1) if len(inp.uses()) == 1 else [inp])
    return leaves


def _is_embedding_gather(value: ir.Value) -> bool:
    node = value.producer()
    if node is None or node.op_type != "Gather" or not is_standard(node):
        return False
    table = _constant(node.inputs[0])
    return table is not None and len(table.shape) == 2


def embedding_sums(candidates: list[LnCandidate]) -> list[LnCandidate]:
    """LNs reading a sum of at least two embedding Gathers: where the optimizer's
    EmbedLayerNormalization matcher starts (a decomposed LN counts: it makes it an LN first)."""
    found = []
    for cand in candidates:
        if cand.form_problem or cand.kind not in (LnKind.LAYER_NORM, LnKind.DECOMPOSED, LnKind.SKIP_LAYER_NORM):
            continue
        inputs = list(cand.node.inputs[:2]) if cand.kind == LnKind.SKIP_LAYER_NORM else [cand.x]
        leaves = [leaf for value in inputs if value is not None for leaf in _add_leaves(value)]
        if sum(_is_embedding_gather(leaf) for leaf in leaves) >= 2:
            found.append(cand)
    return found


def gemm_after_layer_norm(graph: ir.Graph, norms: set[ir.Node]) -> list[ir.Node]:
    """The `Reshape -> Gemm -> Reshape` behind a node of `norms` (the folded LNs): where the gpt2
    optimizer's postprocess may turn a Gemm into MatMul + Add."""
    found = []
    for node in graph:
        if node.op_type != "Gemm" or not is_standard(node):
            continue
        reshape = node.inputs[0].producer() if node.inputs[0] is not None else None
        if reshape is None or reshape.op_type != "Reshape" or reshape.inputs[0] is None:
            continue
        root = reshape.inputs[0].producer()
        after = [use.node.op_type for use in node.outputs[0].uses()]
        if root in norms and "Reshape" in after:
            found.append(node)
    return found


def _reshape_target(node: ir.Node) -> list[int | None] | None:
    """A Reshape's target shape, entries not known as constants None (a Concat of pieces)."""
    target = node.inputs[1] if len(node.inputs) > 1 else None
    values = _ints(target)
    if values is not None:
        return values
    concat = target.producer() if target is not None else None
    if concat is None or concat.op_type != "Concat":
        return None
    out: list[int | None] = []
    for piece in concat.inputs:
        ints = _ints(piece)
        if ints is None:
            out.append(None)  # a dim computed from a shape: one entry, as exporters write them
        else:
            out.extend(ints)
    return out


def attention_heads(graph: ir.Graph, hidden: int) -> int:
    """The head count users pass to the optimizer (`num_heads`), read from the attention's
    `Reshape(x, [batch, seq, heads, head_size])` targets; 0 (the optimizer detects it) if none."""
    counts: Counter[int] = Counter()
    for node in graph:
        if node.op_type != "Reshape" or not is_standard(node):
            continue
        target = _reshape_target(node)
        if target is None or len(target) != 4 or not isinstance(target[3], int) or target[3] <= 1:
            continue
        heads = target[2] if isinstance(target[2], int) and target[2] > 0 else hidden // target[3]
        if heads > 1 and heads * target[3] == hidden:
            counts[heads] += 1
    return counts.most_common(1)[0][0] if counts else 0


# --------------------------------------------------------------------------- what ORT fused


def _fused_nodes(graph: onnx.GraphProto, made_by: dict[str, str]) -> list[onnx.NodeProto]:
    """Nodes ONNX Runtime's fusions made: contrib ops, and Gemms the input graph did not have
    (`made_by`: output name -> op type in the graph ONNX Runtime was given)."""
    fused = []
    for node in graph.node:
        if node.op_type in _NOT_FUSIONS:
            continue
        if node.domain not in _STANDARD or (node.op_type == "Gemm" and made_by.get(node.output[0]) != "Gemm"):
            fused.append(node)
    return fused


@dataclass(frozen=True)
class LostFusion:
    """A fused node of the original's optimized graph that the folded one lacks."""

    op_type: str
    at: str  # the node of the input graph whose output it produces (display name), or ORT's name
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def lost_fusions(
    original: onnx.GraphProto, folded: onnx.GraphProto, made_by: dict[str, str], at: dict[str, str]
) -> list[LostFusion]:
    """Fused nodes of `original` (ORT's optimized graph of the original) whose outputs no fused
    node of `folded` makes: a fusion that became another (Gelu into BiasGelu with the fold's beta
    Add) is not lost. `at`: output name -> display name of its producer in the input graph."""
    folded_outputs = {name for node in _fused_nodes(folded, made_by) for name in node.output if name}
    folded_by_inputs = {(node.op_type, tuple(node.input)) for node in _fused_nodes(folded, made_by)}
    lost = []
    for node in _fused_nodes(original, made_by):
        outputs = tuple(name for name in node.output if name)
        if any(name in folded_outputs for name in outputs):
            continue  # ORT names what it writes after what it fused: the same name is the same fusion
        known = [name for name in outputs if name in made_by]
        if not known and (node.op_type, tuple(node.input)) in folded_by_inputs:
            continue
        place = next((at[name] for name in known if name in at), outputs[0] if outputs else node.name)
        lost.append(LostFusion(node.op_type, place, tuple(node.input), outputs))
    return lost


def _region(graph: ir.Graph, fusion: LostFusion, limit: int = 128) -> tuple[set[ir.Node], set[str]]:
    """The nodes of the input graph the fused node stands for (from its outputs back to its
    inputs) and the names of the tensors they read and write."""
    by_name = {v.name: v for node in graph for v in node.outputs if v is not None and v.name}
    stop = set(fusion.inputs)
    stack = [by_name[name] for name in fusion.outputs if name in by_name]
    nodes: set[ir.Node] = set()
    while stack and len(nodes) < limit:
        node = stack.pop().producer()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        for inp in node.inputs:
            if inp is not None and inp.name not in stop and inp.producer() is not None:
                stack.append(inp)
    tensors = {v.name for node in nodes for v in (*node.inputs, *node.outputs) if v is not None and v.name}
    return nodes, tensors | stop | set(fusion.outputs)


def _use_nodes(uses: tuple[str, ...]) -> set[str]:
    return {use.rsplit(":", 1)[0] for use in uses}


@dataclass(frozen=True)
class Footprint:
    """What one folded LN's rewrite touches, by name (read before the plan is applied: the rewrite
    renames and removes these)."""

    output: str  # the LN's output tensor
    anchor: str  # the node that normalizes (the LN op, a decomposed LN's first ReduceMean)
    own: frozenset[str]  # the LN's own nodes (a decomposed LN's gamma Mul and beta Add among them)
    touched: frozenset[str]  # its own nodes, a residual Add it takes in, the consumers its beta goes into


def footprints(bound: BoundPlan, names: dict[ir.Node, str]) -> dict[str, Footprint]:
    """The footprint of each folded LN of the plan, on the model it was made for (`names`)."""
    out = {}
    for fold in bound.folds:
        rewrite = fold.rewrite
        cand = rewrite.cand
        out[fold.decision.node] = Footprint(
            cand.out.name or "",
            names.get(cand.node, ""),
            frozenset(names[n] for n in cand.nodes if n in names),
            frozenset(names[n] for n in (*rewrite.replaced, *(site.node for site in rewrite.beta.sites)) if n in names),
        )
    return out


def attribute(
    fusion: LostFusion,
    graph: ir.Graph,
    plan: CenteringPlan,
    names: dict[ir.Node, str],
    folds: dict[str, Footprint],
) -> dict[str, str] | None:
    """The LNs whose fold touches the lost fusion's pattern (`graph`: the original), with how:
    an explicit centering that reads a tensor of it, a centered constant it reads, or the LN's
    own nodes and output (`folds`). None when the fused node had taken in a folded LN's gamma
    Mul or beta Add and not its normalization: the RMS op (or the rewrite's beta) does that work
    now, so nothing is lost (a scalar gamma that MatMulScaleFusion had made a FusedMatMul's alpha)."""
    nodes, tensors = _region(graph, fusion)
    node_names = {names[n] for n in nodes if n in names}
    for footprint in folds.values():
        if footprint.own & node_names and footprint.anchor not in node_names:
            return None
    why: dict[str, str] = {}
    for centering in plan.centerings:
        if centering.tensor in tensors:
            for ln in centering.required_by:
                why.setdefault(ln, f"its explicit centering reads '{centering.tensor}', inside the fused pattern")
    for edit in plan.edits:
        if _use_nodes(edit.uses) & node_names:
            for ln in edit.required_by:
                why.setdefault(ln, f"it centers '{edit.tensor}', which the fused pattern reads")
    for ln, footprint in folds.items():
        if footprint.output in tensors or footprint.touched & node_names:
            why.setdefault(ln, "the fused pattern reads its output")
    return why


# --------------------------------------------------------------------------- the check


@dataclass
class GemmAdvice:
    """The gpt2 optimizer's node counts on both orders, and the Gemms the fold leaves."""

    nodes_original: int
    nodes_folded: int
    gemms_left: int


@dataclass(frozen=True)
class OptimizerFirst:
    """What the fold makes of the transformers optimizer's output (`FusionCheck.optimizer_first`):
    LNs folded of all there and here, the optimizer's settings, and the large tensors it made from
    the zeros, which the analysis took for unknown inputs (any: `folded` is a lower bound)."""

    folded: int
    layer_norms: int
    folded_here: int
    layer_norms_here: int
    model_type: str
    opt_level: int
    num_heads: int
    hidden_size: int
    onnxruntime: str
    unknown: tuple[str, ...]

    @property
    def at_least(self) -> bool:
        return bool(self.unknown)


@dataclass
class FusionCheck:
    """ONNX Runtime's fusions on weightless copies of one model, for one analysis. Inactive
    (decides nothing) when disabled or when onnxruntime cannot be imported; `unchecked` then says
    why for the report."""

    model: ir.Model
    enabled: bool = True
    version: str | None = None
    unchecked: str | None = None  # why nothing was checked, for the order advice
    embed_kept: dict[str, str] = field(default_factory=dict)  # LN -> its fusion's tables
    gemm: GemmAdvice | None = None
    # The explicit centerings (by tensor) the last folded copy's session ran elsewhere than written
    # (`session_layout.moved_centerings`), set by `session_fusion_costs`: the cost rule prices them so.
    moved_centerings: set[str] = field(default_factory=set)
    _folder: WeightlessFolder | None = None
    _original: Path | None = None
    _original_bytes: int = 0  # weights the weightless original stands for
    _folded: Path | None = None
    _optimizers: dict[str, TransformersOptimizer] = field(default_factory=dict)  # by the file's digest
    _process: OptimizerProcess | None = None  # the optimizer's child process, for a large model
    _made_by: dict[str, str] = field(default_factory=dict)
    _at: dict[str, str] = field(default_factory=dict)
    _heads: tuple[int, int] | None = None  # (num_heads, hidden_size) the optimizer was given

    @classmethod
    def start(cls, model: ir.Model, enabled: bool) -> FusionCheck:
        check = cls(model, enabled)
        if enabled:
            check.version = ort_version()
            if check.version is None:
                check.unchecked = "onnxruntime (with its transformers optimizer) is not installed"
            elif weight_bytes(model) > CHILD_ABOVE_BYTES:  # its child starts while the LNs are found
                check._folder = WeightlessFolder()
                check._process = OptimizerProcess(check._folder.path)
                check._process.start()
        return check

    @property
    def active(self) -> bool:
        return self.enabled and self.version is not None

    def __enter__(self) -> FusionCheck:
        return self

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None
        self._optimizers.clear()
        if self._folder is not None:
            self._folder.close()
            self._folder = None

    def _give_up(self, what: str, error: Exception) -> None:
        while error.__cause__ is not None:  # onnx-ir wraps its errors in the call that raised them
            error = error.__cause__  # type: ignore[assignment]
        message = str(error).splitlines()[0][:200] if str(error) else ""
        logger.info("ONNX Runtime could not %s: %s: %s", what, type(error).__name__, message)  # the advice says it
        self.unchecked = f"ONNX Runtime could not {what}: {type(error).__name__}: {message}"
        self.version = None

    def _original_path(self) -> Path:
        if self._original is None:
            self._folder = self._folder or WeightlessFolder()
            self._original = self._folder.write(weightless_clone(self.model, self._folder), "original.onnx")
            self._original_bytes = self._folder.stripped_bytes
            graph = self.model.graph
            self._made_by = {v.name: n.op_type for n in graph for v in n.outputs if v is not None and v.name}
            names = display_names(graph)
            self._at = {v.name: names[n] for n in graph for v in n.outputs if v is not None and v.name}
        return self._original

    def _optimizer(self, path: Path, model_type: str, level: int, heads: int, hidden: int) -> onnx.ModelProto:
        """The transformers optimizer's output for the weightless file `path` (`probe.TransformersOptimizer`,
        its large tensors references: `ort_fusions.light`), run once per file content and settings."""
        key, optimizer = self._optimizer_for(path, model_type, level, heads, hidden)
        return _cached(key, lambda: optimizer.run(model_type, level, heads, hidden))  # type: ignore[return-value]

    def _optimizer_ahead(self, path: Path, model_type: str, level: int, heads: int, hidden: int) -> Callable[[], onnx.ModelProto]:
        """`_optimizer`, sent ahead to the child process where there is one: what it returns gives
        the output (or raises what the run raised) when called."""
        key, optimizer = self._optimizer_for(path, model_type, level, heads, hidden)
        if key in _CACHE:
            return lambda: _CACHE[key]  # type: ignore[return-value]
        try:
            result = optimizer.submit(model_type, level, heads, hidden)
        except Exception as error:  # noqa: BLE001 - raised where the output is asked for, as `_optimizer` would
            failure = error

            def result() -> onnx.ModelProto:
                raise failure

        return lambda: _cached(key, result)  # type: ignore[return-value]

    def _optimizer_for(self, path: Path, model_type: str, level: int, heads: int, hidden: int) -> tuple[tuple, TransformersOptimizer]:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert self._folder is not None
        if self._process is None and self._original_bytes > CHILD_ABOVE_BYTES:
            self._process = OptimizerProcess(self._folder.path)  # reads only the zeros it asks for
        if digest not in self._optimizers:  # one per file content: its opt_level 1 session runs once
            self._optimizers[digest] = TransformersOptimizer(path, self._folder, self._process)
        return ("optimizer", digest, model_type, level, heads, hidden), self._optimizers[digest]

    def _session(self, path: Path) -> onnx.GraphProto:
        key = ("session", hashlib.sha256(path.read_bytes()).hexdigest())
        assert self._folder is not None
        folder = self._folder
        return _cached(key, lambda: session_graph(path, folder))  # type: ignore[return-value]

    # ------------------------------------------------------------------ the plan that costs no fusion

    def settle(self, planner: Planner, apply: Callable[[ir.Model, BoundPlan], object]) -> BoundPlan:
        """The plan of `planner`'s model that costs no ONNX Runtime fusion: the LNs the transformers
        optimizer fuses into EmbedLayerNormalization kept (`embed_layer_norm_costs`) and the
        decomposed LNs priced as a session runs them (`layouts`); then, while the plan folds any
        LN, that plan applied to a weightless clone by `apply` (the pipeline's apply step, a later
        step than this one, handed in), the LNs whose fold loses a session fusion kept
        (`session_fusion_costs`) and the explicit centerings the folded copy's session runs off
        their written axis priced so, and the plan made again, until it loses none and prices
        every centering as it runs. Inactive: the plan with nothing kept for a fusion."""
        kept = self.embed_layer_norm_costs(planner.lns)
        planner.run_as(self.layouts(planner.lns))
        bound = planner.plan(kept)
        while bound.plan.folded and self.active:
            lost = self.session_fusion_costs(lambda clone, kept=kept: planner.plan_clone(clone, kept), apply)
            lost = {name: blocked for name, blocked in lost.items() if name not in kept}
            mispriced = planner.reprice_moved(bound, self.moved_centerings)
            if not lost and not mispriced:
                break
            kept = {**kept, **lost}
            bound = planner.plan(kept)
        return bound

    # ------------------------------------------------------------------ EmbedLayerNormalization

    def embed_layer_norm_costs(self, candidates: list[LnCandidate]) -> dict[str, Blocked]:
        """The LNs the transformers optimizer fuses into EmbedLayerNormalization, with the reason."""
        pending = embedding_sums(candidates)
        if not pending or not self.active:
            return {}
        try:
            path = self._original_path()
        except Exception as error:
            self._give_up("make a weightless copy", error)
            return {}
        by_params = {(c.scale.name if c.scale else None, c.bias.name if c.bias else None): c for c in pending}
        heads, size = self._settings(pending)
        runs: dict[str, list[str]] = {}
        tables: dict[str, list[str]] = {}
        failed: list[Exception] = []
        # Sent ahead, opt_level 0 first: the child runs them while this process runs the session
        # that opt_level 1 starts from.
        ahead = {run: self._optimizer_ahead(path, *run, heads, size if heads else 0) for run in sorted(EMBED_RUNS, key=lambda r: r[1])}
        if self._process is not None:  # while the child works: the session graph the later checks read
            with contextlib.suppress(Exception):  # they run it again, and say why it failed
                self._session(path)
        for model_type, level in EMBED_RUNS:
            try:
                graph = ahead[(model_type, level)]().graph
            except Exception as error:  # the optimizer fails on this graph: that run fuses nothing
                logger.info("optimize_model(model_type=%s, opt_level=%d) failed: %s", model_type, level, error)
                failed.append(error)
                continue
            for node in graph.node:
                if node.op_type != EMBED_LAYER_NORM.op_type or len(node.input) < 7:
                    continue
                cand = by_params.get((node.input[5], node.input[6]))
                if cand is None:
                    continue
                setting = f"model_type {model_type}, opt_level {level}"
                if heads:
                    setting += f", num_heads {heads}, hidden_size {size}"
                runs.setdefault(cand.name, []).append(setting)
                tables[cand.name] = [name for name in node.input[2:5] if name]
            if set(runs) == {c.name for c in pending}:
                break  # every candidate is fused: the other runs can only agree
        if len(failed) == len(EMBED_RUNS):
            self._give_up("run its transformers optimizer on a weightless copy", failed[0])
            return {}
        costs = {}
        for name, settings in runs.items():
            listed = ", ".join(f"'{t}'" for t in tables[name])
            self.embed_kept[name] = listed
            costs[name] = Blocked(
                "fusion-cost",
                f"kept: ONNX Runtime's transformers optimizer ({OPTIMIZER}; {settings[0]}; onnxruntime "
                f"{self.version}) fused it with the embedding Gathers of {listed} into "
                "com.microsoft::EmbedLayerNormalization on a weightless copy of this graph; that op has no RMS "
                "form, so folding the LN would cost the fusion. Run the optimizer first: the LNs it leaves fold "
                "either way",
                detail=f"{OPTIMIZER}; {settings[0]}; onnxruntime {self.version}; the Gathers of {listed}",
            )
        return costs

    def _settings(self, candidates: list[LnCandidate]) -> tuple[int, int]:
        """The (num_heads, hidden_size) a user would give the optimizer: the widest LN and the
        attention's heads (`attention_heads`); the first asked for is kept, so that every run
        of this check finds the optimizer's cached output."""
        if self._heads is None:
            size = max((_hidden(c) for c in candidates), default=0)
            self._heads = (attention_heads(self.model.graph, size) if size else 0, size)
        return self._heads

    # ------------------------------------------------------------------ how the LNs run

    def layouts(self, candidates: list[LnCandidate]) -> dict[str, OrtLayout]:
        """How an ONNX Runtime session runs the decomposed LNs it does not fuse, where that is not
        as written (`ort_fusions.session_layout`): what the cost rule prices for them."""
        if not self.active or not any(c.form.is_pattern for c in candidates):
            return {}
        try:
            session = self._session(self._original_path())
        except Exception as error:
            self._give_up("optimize a weightless copy in a session", error)
            return {}
        return decomposed_layouts(candidates, session)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ session fusions

    def session_fusion_costs(
        self, plan_on: Callable[[ir.Model], BoundPlan], apply: Callable[[ir.Model, BoundPlan], object]
    ) -> dict[str, Blocked]:
        """Apply the plan (as `plan_on` makes it for a clone of the model, by the pipeline's own
        apply step `apply`, which this check is handed rather than imports) to a weightless copy,
        run both copies through an ONNX Runtime session, and return the LNs whose fold loses a
        fusion the original had, with the reason."""
        if not self.active:
            return {}
        try:
            original = self._session(self._original_path())
            assert self._folder is not None
            clone = clone_model(self.model)
            bound = plan_on(clone)  # reads the constants the analysis reads, as the analysis did
            folds = footprints(bound, display_names(clone.graph))
            self._folder.strip(clone)
            apply(clone, bound)
            self._folder.strip(clone)  # the centered copies, never computed
            self._folded = self._folder.write(clone, "folded.onnx")
            folded = self._session(self._folded)
            self.moved_centerings = moved_centerings(bound.plan.centerings, folded)  # type: ignore[arg-type]
        except Exception as error:
            self._give_up("optimize a weightless copy in a session", error)
            return {}
        graph = self.model.graph
        names = display_names(graph)
        costs: dict[str, Blocked] = {}
        for fusion in lost_fusions(original, folded, self._made_by, self._at):
            why = attribute(fusion, graph, bound.plan, names, folds)
            if why is None:
                continue  # the fold's own op does what the fused node did
            if not why:
                logger.info("ONNX Runtime's %s fusion at '%s' is lost, by no LN's fold", fusion.op_type, fusion.at)
            for ln, how in why.items():
                costs.setdefault(
                    ln,
                    Blocked(
                        "fusion-lost",
                        f"kept: folding it would cost ONNX Runtime's {fusion.op_type} fusion at '{fusion.at}' ({how}): "
                        f"an onnxruntime {self.version} session (ORT_ENABLE_ALL, CPU) fuses it on a weightless copy "
                        "of this graph and not on the folded one",
                        fusion.at,
                        detail=f"{fusion.op_type} at '{fusion.at}': {how}",
                    ),
                )
        return costs

    # ------------------------------------------------------------------ order advice

    def gemm_order(self, folded_norms: set[ir.Node]) -> GemmAdvice | None:
        """The gpt2 optimizer on both weightless copies, where a folded LN feeds Reshape -> Gemm: its
    node counts when folding first leaves it more Gemms and more nodes, else None."""
        if not self.active or self._folded is None or not gemm_after_layer_norm(self.model.graph, folded_norms):
            return None
        try:
            model_type, level = GEMM_RUN
            before = self._optimizer(self._original_path(), model_type, level, 0, 0).graph
            after = self._optimizer(self._folded, model_type, level, 0, 0).graph
        except Exception as error:
            self._give_up("run its transformers optimizer (model_type gpt2) on a weightless copy", error)
            return None
        gemms = sum(n.op_type == "Gemm" for n in after.node) - sum(n.op_type == "Gemm" for n in before.node)
        if gemms <= 0 or len(after.node) <= len(before.node):
            return None  # the order matters where folding first leaves the optimizer a larger graph
        self.gemm = GemmAdvice(len(before.node), len(after.node), gemms)
        return self.gemm

    # ------------------------------------------------------------------ optimizer first

    def optimizer_first(self, plan: CenteringPlan, planner: Planner) -> OptimizerFirst | None:
        """The fold's count on the transformers optimizer's output (`OPTIMIZER_FIRST_RUN`, on the
        weightless copy, its tensors rebound to this model's: `ort_fusions.optimizer_first`), where
        more LNs fold there than in `plan` (`planner`'s, settled); else None. Counted by a plan of
        that output made as `planner` makes its own (`Planner.alike`), with no fusion check of its
        own; a plan, not a count of its LNs, since which fold depends on its whole graph (the
        side-effect rule). Runs only where it can matter: an LN kept for its cost (the optimizer
        changes what ONNX Runtime runs, which is what the cost rule prices) in a graph that is not
        the optimizer's output yet. A failure is logged and says nothing."""
        if not self.active or not any(d.stage == "cost" for d in plan.kept) or already_optimized(self.model):
            return None
        model_type, level = OPTIMIZER_FIRST_RUN
        try:
            heads, size = self._settings(planner.lns)
            hidden = size if heads else 0
            optimized = rebound(self._optimizer(self._original_path(), model_type, level, heads, hidden), self.model)
            there = planner.alike(optimized.model).plan({}).plan
        except Exception as error:  # the optimizer or the analysis of its output failed: no advice
            what = f"optimize_model(model_type={model_type}, opt_level={level})"
            logger.info("The fold of %s's output was not counted: %s: %s", what, type(error).__name__, error)
            return None
        if len(there.folded) <= len(plan.folded):
            return None
        counts = (len(there.folded), len(there.decisions), len(plan.folded), len(plan.decisions))
        return OptimizerFirst(*counts, model_type, level, heads, hidden, self.version or "", optimized.unknown)


def _hidden(cand: LnCandidate) -> int:
    scale = _constant(cand.scale)
    return int(scale.shape[-1]) if scale is not None and len(scale.shape) else 0


__all__ = [
    "EMBED_RUNS",
    "Footprint",
    "FusionCheck",
    "GemmAdvice",
    "LostFusion",
    "OPTIMIZER_FIRST_RUN",
    "OptimizerFirst",
    "attention_heads",
    "attribute",
    "embedding_sums",
    "footprints",
    "gemm_after_layer_norm",
    "lost_fusions",
]
