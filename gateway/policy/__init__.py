"""Pure policy: routing rules, prefix fingerprints, balancers, cap and KV arithmetic. No I/O,
no logging, no awaits, no clock reads (tests/unit/test_layering.py)."""
