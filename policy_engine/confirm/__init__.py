"""Human confirmation (seed 001 §4.6): who may stand in for a missing consent, and how."""
