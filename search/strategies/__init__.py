"""search.strategies."""
