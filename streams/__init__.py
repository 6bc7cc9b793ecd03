"""Confidence streams: real-time confidence scoring of LLM agent events on Kafka."""
