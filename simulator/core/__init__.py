"""Errors, atomic file writes, user files, the strict pydantic base model and the vocabularies
every layer shares."""
