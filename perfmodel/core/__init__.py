"""Core: what every layer may use (errors, file and text safety helpers)."""
