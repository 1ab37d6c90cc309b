"""Checks on the repository as a whole: the import rules between layers, a docstring on every test."""
