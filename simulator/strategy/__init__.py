"""The training knobs, the software stacks and the parallel layout."""
