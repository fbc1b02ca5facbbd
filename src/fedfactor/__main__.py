"""`python -m fedfactor`: the same CLI as the `fedfactor` command (used by the workflow under --sdm conda)."""

from .cli import main

raise SystemExit(main())
