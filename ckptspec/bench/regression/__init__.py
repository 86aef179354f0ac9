"""CI's benchmark regression pass: a baseline recorded on the runner, a comparison, a history and its trend.

`python -m ckptspec.bench.regression` (`__main__`): `record`, `compare`, `trend`, `scale`. The modules: `measure`
(running the set, its figures), `baseline` (the baseline file), `compare` (the verdict), `history` (JSON lines,
the trend picture).
"""
