"""``python -m tallow``: the same as the ``tallow`` command."""

from tallow.cli import main

raise SystemExit(main())
