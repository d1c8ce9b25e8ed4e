"""Numbered notebooks (a package only so that pytest imports their conftest under its own name)."""
