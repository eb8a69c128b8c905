"""`gateway bench`: a load client that measures per-request speed ("your answer") and aggregate
throughput ("the machine") separately, against the gateway or any OpenAI-compatible URL."""
