"""The in-process simulator: K islands on a virtual clock with the real core, and its report."""
