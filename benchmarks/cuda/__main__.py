import sys

from benchmarks.cuda.sweep import main

sys.exit(main())
