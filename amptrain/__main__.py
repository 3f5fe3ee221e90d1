"""``python -m amptrain`` is the ``amptrain`` command."""
import sys

from .cli import main

sys.exit(main())
