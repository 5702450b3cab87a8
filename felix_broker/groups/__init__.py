"""Consumer groups: the request service, a group's state, and its stored cursor records."""
