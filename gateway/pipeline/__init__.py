"""The serving path of one completion request: parse, resolve, route, cap, admit, attempt, relay, account."""
