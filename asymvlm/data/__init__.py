"""Data ingestion: encoders and tiny offline models for tests and demos."""
