"""Pure scoring math: no Kafka, Faust, clock or environment access in this package."""
