"""Submission and verification: a run checked from its records (check), the MLPerf-style logs
(mlperf), the bundle format (bundle) and ``automlperf submit`` (submit, site), and the best
accuracy measured again (remeasure) with its record in a bundle (remeasure_record)."""
