"""Recipes: the typed schema and the files it is read from."""
