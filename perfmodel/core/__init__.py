"""Core: what every layer may use: units, the user-error type, the categorical codes, file and
text safety helpers, and the C heap's thresholds for batch evaluation."""
