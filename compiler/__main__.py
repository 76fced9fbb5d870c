"""`python -m compiler` is `gc` (Debian's graphviz also ships a program called gc)."""

import sys

from compiler.cli import main

sys.exit(main())
