import sys

from onnx_lnfold._cli import main

sys.exit(main())
