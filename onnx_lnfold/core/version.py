"""The package's version, in the one place every step reads it (the report, the written model's
account of the fold) and `onnx_lnfold.__version__` gives; pyproject.toml states it for packaging,
and a test holds the two equal."""

VERSION = "0.1.0"
