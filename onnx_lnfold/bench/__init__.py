"""Tools beside the pipeline, on top of it like the drivers: does the fold pay, on this model and
this machine, and what do the kernels the cost rule prices cost on this execution provider.

- `onnx-lnfold bench ORIGINAL FOLDED` (`compare`): the original, its re-saved copy and the fold
  timed in fresh processes (`process` starts them, `runner` runs in them: sessions created in
  rotated order, rounds interleaved),
  ratios with bootstrap intervals (`stats`) and a verdict in words, the normalizations' kernel time
  from ONNX Runtime's profiler (`profile`), on the provider asked for and no other (`placement`);
- `onnx-lnfold calibrate --provider NAME -o costs.json` (`calibrate`): the kernel costs the
  never-slower rule reads, measured on that provider over the shapes it decides on (`graphs`: the
  chains of one node kind timed), fitted into a cost table (`tables`) that `--costs` folds by.

`benchmarks/` calls the same code. Takes model files and a provider; gives figures, never a model.
Importing this package imports nothing heavy (the command line's start-up reads `cli` alone).
"""
