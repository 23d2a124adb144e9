"""The pure data code beside models/ and sandbox/: the problem families and their generator, the general exercises,
the feedback-log simulator, preference mining, PII pseudonymisation and the row schemas. It imports no Prefect,
MLflow, DVC or Great Expectations; tasks/ wraps it in Prefect tasks around I/O and tracking."""
