"""``python -m asymvlm.cli``: the ``asymvlm`` command line."""

from asymvlm.cli import main

raise SystemExit(main())
