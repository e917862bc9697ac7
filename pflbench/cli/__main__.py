"""`python -m pflbench.cli ...`: the same as the `pflbench` command."""

import sys

from pflbench.cli import main

sys.exit(main())
