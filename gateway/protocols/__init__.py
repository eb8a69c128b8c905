"""One adapter per client protocol (parse, estimate inputs, edits, stream observer, error shape)."""
