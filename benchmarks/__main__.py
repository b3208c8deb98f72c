"""`python -m benchmarks`: run the benchmarks and write benchmarks/RESULTS.md."""

import sys

from benchmarks.run import main

sys.exit(main())
