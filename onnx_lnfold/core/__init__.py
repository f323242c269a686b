"""Core: what every step shares. The options (`FoldOptions`), the error family (`LnFoldError`),
the refusals (`Blocked`, its codes and stages), the ops the fold recognizes and emits (`ops`),
reading the IR (constants, axes, labels), the one value a tensor holds for every input (`values`),
fresh names, progress lines, work started ahead on a thread of its own (`ahead`).

Nothing here imports numpy, onnx or onnx_ir at import time where the command line's start-up
reads it (`options`, `errors`): `-V` and `--help` answer from them alone.
"""
