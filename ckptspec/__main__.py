"""`python -m ckptspec ...`: the `ckptspec` command (ckptspec.cli)."""

from ckptspec.cli import main

raise SystemExit(main())
