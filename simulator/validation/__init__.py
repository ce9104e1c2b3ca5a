"""Predicted against published: end-to-end runs, parallel layouts, other families."""
