"""Errors, atomic file writes, user files and the vocabularies every layer shares."""
