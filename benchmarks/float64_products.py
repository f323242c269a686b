"""The float64 twins' products, as the check runs them on a model larger than memory.

    python -m benchmarks.float64_products [--rows 16] [--rounds 5] [--out benchmarks/results/float64_products]

A float64 twin multiplies a few rows of activations (16 on the first input set) by each weight,
read in blocks of rows and widened to float64 (`verify.oracle.part_reads.streamed_matmul`). Times,
interleaved round by round, on a GPT-2-style layer's weight shapes:

    shipped         the product as the check computes it, OpenBLAS on one thread (as while the passes
                    run side by side, `verify.oracle.blas_threads`)
    shipped, all    the same, OpenBLAS on every core (a twin run alone)
    before          the form it replaced: the transposed product (W^T X^T), a fresh output per
                    block, 16 MB blocks, OpenBLAS on every core

and reports per weight entry the wall and the process CPU nanoseconds (median [min-max] over the
rounds), and each variant's ratio to `shipped` (paired bootstrap 95% interval).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from benchmarks.common import fmt_ratio, log, machine_info, ratio_of_medians, results_header
from onnx_lnfold.io.tensor_io import row_blocks
from onnx_lnfold.verify.oracle import part_reads
from onnx_lnfold.verify.oracle.blas_threads import blas_threads_at_most

SHAPES = [(4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096)]  # qkv, projection, MLP in, MLP out


def _before(weight: ir.Tensor, rows: np.ndarray) -> np.ndarray:
    """The product as the check computed it before: (W^T X^T)^T, 16 MB blocks, a fresh output each."""
    depth, width = weight.shape
    total = np.zeros((width, rows.shape[0]))
    widened = None
    for part, block in row_blocks(weight, 16 << 20):
        if widened is None:
            widened = np.empty(block.shape, dtype=np.float64)
        wide = widened[: len(block)]
        wide[...] = block
        total += wide.T @ rows[:, part].T
    return np.ascontiguousarray(total.T)


def _shipped(weight: ir.Tensor, rows: np.ndarray) -> np.ndarray:
    node = onnx.helper.make_node("MatMul", ["x", "w"], ["y"])
    (out,) = part_reads.streamed_matmul(node, weight, [{"x": rows}])
    return out


VARIANTS = {
    "shipped": (_shipped, 1),
    "shipped, all": (_shipped, None),
    "before": (_before, None),
}


def _timed(variant: str, weights: list[ir.Tensor], rows: dict[int, np.ndarray]) -> tuple[float, float]:
    fn, threads = VARIANTS[variant]
    wall, cpu = time.perf_counter(), time.process_time()
    with blas_threads_at_most(threads) if threads is not None else contextlib.nullcontext():
        for weight in weights:
            fn(weight, rows[weight.shape[0]])
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16, help="activation rows (the first input set's tokens)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/float64_products"))
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    weights = [ir.Tensor(rng.standard_normal(shape, dtype=np.float32), name=f"w{i}") for i, shape in enumerate(SHAPES)]
    rows = {depth: rng.standard_normal((args.rows, depth)) for depth in {s[0] for s in SHAPES}}
    entries = sum(int(np.prod(s)) for s in SHAPES)
    for weight in weights:  # the same product every way
        got, want = _shipped(weight, rows[weight.shape[0]]), rows[weight.shape[0]] @ weight.numpy().astype(np.float64)
        assert np.allclose(got, want, rtol=1e-12, atol=1e-9), "the shipped product is not the product"
        assert np.allclose(_before(weight, rows[weight.shape[0]]), want, rtol=1e-12, atol=1e-9)
    times: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": []} for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS:  # interleaved: a round runs every variant once
            wall, cpu = _timed(variant, weights, rows)
            times[variant]["wall"].append(wall / entries * 1e9)
            times[variant]["cpu"].append(cpu / entries * 1e9)
        log(f"round {r + 1} of {args.rounds}: " + ", ".join(f"{v} {times[v]['wall'][-1]:.2f} ns" for v in VARIANTS))

    def spread(values: list[float]) -> str:
        return f"{np.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

    machine = machine_info()
    command = "python -m benchmarks.float64_products " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = results_header("float64 twin products", command.strip(), machine, f"{args.rounds} interleaved rounds, {args.rows} rows")
    lines += [
        f"Weights: {', '.join(f'{a}x{b}' for a, b in SHAPES)} (float32, {entries / 1e6:.0f} M entries), {args.rows} activation rows in float64.",
        "",
        "| variant | wall ns / entry | CPU ns / entry | wall vs shipped | CPU vs shipped |",
        "|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        t, base = times[variant], times["shipped"]
        lines.append(
            f"| {variant} | {spread(t['wall'])} | {spread(t['cpu'])} | {fmt_ratio(ratio_of_medians(t['wall'], base['wall']), 2)} "
            f"| {fmt_ratio(ratio_of_medians(t['cpu'], base['cpu']), 2)} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "FLOAT64_PRODUCTS.md").write_text("\n".join(lines) + "\n")
    (args.out / "float64_products.json").write_text(json.dumps({"machine": machine, "rows": args.rows, "shapes": SHAPES, "times_ns_per_entry": times}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
