"""The search: a problem from user input, its strategy space evaluated at once, layouts searched."""
