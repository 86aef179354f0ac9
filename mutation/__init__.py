"""Mutation score of the reference implementation (cosmic-ray), run outside CI: `nox -s mutation`."""
