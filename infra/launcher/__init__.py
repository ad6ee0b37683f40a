"""Local servers for development and tests (a one-node Kafka broker without Docker)."""
