"""Structured outputs: a request's decoding constrained by a JSON schema, a regex, a grammar or a
choice (`spec.Constraint`), compiled by llguidance into a token mask applied before each sample."""
