"""Core: what every layer may use: units, the user-error type, the categorical codes, and file
and text safety helpers."""
