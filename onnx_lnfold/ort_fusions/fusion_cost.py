"""The fusion-cost rule (docs/DESIGN.md section 10): the LNs whose fold would cost an ONNX Runtime
fusion stay LNs, and what ONNX Runtime did is the reason. Every claim comes from ONNX Runtime's
own code, run on weightless copies of the graph (`ort_fusions.weightless`, `ort_fusions.probe`); the structural
pre-filters (`ort_fusions.prefilter`) only skip running it on graphs where it has nothing to find.
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
  (code `fusion-lost`) and the plan made again, until nothing is lost (`ort_fusions.session_fusions`).
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.analysis.planner import Planner
from onnx_lnfold.core.ahead import Ahead
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import weight_bytes
from onnx_lnfold.core.names import display_names
from onnx_lnfold.core.ops import EMBED_LAYER_NORM
from onnx_lnfold.decide.costs import OrtLayout
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.ort_fusions.optimizer_first import already_optimized, rebound
from onnx_lnfold.ort_fusions.prefilter import attention_heads, embedding_sums, gemm_after_layer_norm, hidden_size
from onnx_lnfold.ort_fusions.probe import (
    CHILD_ABOVE_BYTES,
    OptimizerProcess,
    TransformersOptimizer,
    ort_version,
    session_graph,
)
from onnx_lnfold.ort_fusions.session_fusions import attribute, footprints, lost_fusions
from onnx_lnfold.ort_fusions.session_layout import decomposed_layouts, moved_centerings
from onnx_lnfold.ort_fusions.weightless import WeightlessFolder, weightless_clone

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

# Results of ONNX Runtime on one weightless file, by the file's bytes: folding the same graph
# again (tests, a dry run then the fold) does not run ONNX Runtime again.
_CACHE: dict[tuple, object] = {}
_CACHE_SIZE = 64


def clear_cache() -> None:
    """Forget every result: the next check runs ONNX Runtime again."""
    _CACHE.clear()


def _cached(key: tuple, compute: Callable[[], object]) -> object:
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = compute()
    return _CACHE[key]


# --------------------------------------------------------------------------- the check

_SESSION_THREAD = "lnfold-fusion-session"  # where a weightless copy's session is made ahead


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
    _names: dict[ir.Node, str] | None = None
    _meanwhile: Callable[[], object] | None = None

    @classmethod
    def start(cls, model: ir.Model, enabled: bool, meanwhile: Callable[[], object] | None = None) -> FusionCheck:
        """`meanwhile`: the caller's own work, done while a session of the folded copy is made
        (once, the first time one is; ONNX Runtime releases the interpreter meanwhile)."""
        check = cls(model, enabled)
        check._meanwhile = meanwhile
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
            self._original = self._folder.write_stripped(self.model, "original.onnx")
            self._original_bytes = self._folder.stripped_bytes
            graph = self.model.graph
            self._made_by = {v.name: n.op_type for n in graph for v in n.outputs if v is not None and v.name}
            names = self._model_names()
            self._at = {v.name: names[n] for n in graph for v in n.outputs if v is not None and v.name}
        return self._original

    def _model_names(self) -> dict[ir.Node, str]:
        """`display_names` of the model, which the check never changes: made once."""
        if self._names is None:
            self._names = display_names(self.model.graph)
        return self._names

    def _optimizer(self, path: Path, model_type: str, level: int, heads: int, hidden: int) -> onnx.ModelProto:
        """The transformers optimizer's output for the weightless file `path` (`probe.TransformersOptimizer`,
        its large tensors references: `ort_fusions.light`), run once per file content and settings."""
        key, optimizer = self._optimizer_for(path, model_type, level, heads, hidden)
        return _cached(key, lambda: optimizer.run(model_type, level, heads, hidden))  # type: ignore[return-value]

    def _optimizer_ahead(
        self, path: Path, model_type: str, level: int, heads: int, hidden: int
    ) -> Callable[[], onnx.ModelProto]:
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

    def _optimizer_for(
        self, path: Path, model_type: str, level: int, heads: int, hidden: int
    ) -> tuple[tuple, TransformersOptimizer]:
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

    def _folded_session(self, path: Path) -> onnx.GraphProto:
        """`_session` of the folded copy: made on a thread while the caller's `meanwhile` runs,
        where it has any left."""
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is None:
            return self._session(path)
        made = Ahead([lambda: self._session(path)], _SESSION_THREAD)
        try:
            meanwhile()
        except BaseException:
            made.join()  # its files are in the folder, which goes with the check
            raise
        return made.result()

    # ------------------------------------------------------------------ the plan that costs no fusion

    def settle(self, planner: Planner, apply: Callable[[ir.Model, BoundPlan], object]) -> BoundPlan:
        """The plan of `planner`'s model that costs no ONNX Runtime fusion: the LNs the transformers
        optimizer fuses into EmbedLayerNormalization kept (`embed_layer_norm_costs`) and the
        decomposed LNs priced as a session runs them (`layouts`); then, while the plan folds any
        LN, that plan bound to a weightless clone and applied there by `apply` (the pipeline's
        apply step, a later step than this one, handed in), the LNs whose fold loses a session fusion kept
        (`session_fusion_costs`) and the explicit centerings the folded copy's session runs off
        their written axis priced so, and the plan made again, until it loses none and prices
        every centering as it runs. Inactive: the plan with nothing kept for a fusion."""
        kept = self.embed_layer_norm_costs(planner.lns)
        planner.run_as(self.layouts(planner.lns))
        bound = planner.plan(kept)
        while bound.plan.folded and self.active:
            lost = self.session_fusion_costs(bound, apply)
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
        ahead = {
            run: self._optimizer_ahead(path, *run, heads, size if heads else 0)
            for run in sorted(EMBED_RUNS, key=lambda r: r[1])
        }
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
            size = max((hidden_size(c) for c in candidates), default=0)
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
        self, plan: BoundPlan, apply: Callable[[ir.Model, BoundPlan], object]
    ) -> dict[str, Blocked]:
        """Apply `plan` (the model's, bound to a weightless clone: `BoundPlan.on_clone`) to that
        clone by the pipeline's own apply step `apply` (handed in rather than imported), run both
        weightless copies through an ONNX Runtime session, and return the LNs whose fold loses a
        fusion the original had, with the reason."""
        if not self.active:
            return {}
        try:
            # The original's session is made on a thread of its own while the clone is made and
            # the plan applied to it.
            path = self._original_path()
            original_session = Ahead([lambda: self._session(path)], _SESSION_THREAD)
        except Exception as error:
            self._give_up("optimize a weightless copy in a session", error)
            return {}
        assert self._folder is not None
        try:
            # Binding and applying the plan are this tool's own steps: a failure there is its own,
            # not ONNX Runtime's, and is raised.
            clone = weightless_clone(self.model, self._folder)
            bound = plan.on_clone(self.model, clone)
            folds = footprints(bound, display_names(clone.graph))
            apply(clone, bound)
            self._folder.strip(clone)  # the centered copies, never computed
            folded_plan = bound.plan
            try:
                self._folded = self._folder.write(clone, "folded.onnx")
                del clone, bound  # let go before the session is waited for: the caller's `meanwhile` may collect them
                folded = self._folded_session(self._folded)
                original = original_session.result()
                self.moved_centerings = moved_centerings(folded_plan.centerings, folded)  # type: ignore[arg-type]
            except Exception as error:
                self._give_up("optimize a weightless copy in a session", error)
                return {}
        finally:
            original_session.join()  # its files are in the folder, which goes with the check
        graph = self.model.graph
        names = self._model_names()
        costs: dict[str, Blocked] = {}
        for fusion in lost_fusions(original, folded, self._made_by, self._at):
            why = attribute(fusion, graph, folded_plan, names, folds)
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


__all__ = [
    "EMBED_RUNS",
    "GEMM_RUN",
    "OPTIMIZER",
    "OPTIMIZER_FIRST_RUN",
    "FusionCheck",
    "GemmAdvice",
    "OptimizerFirst",
    "clear_cache",
]
