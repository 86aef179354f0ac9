"""`python -m ckptspec ...`: the `ckptspec` command (ckptspec.spec.harness.cli)."""

from ckptspec.spec.harness.cli import main

raise SystemExit(main())
