"""Measurement: score and validity, resource monitor, system description."""
