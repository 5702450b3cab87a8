"""A client's session: the sans-IO stream protocol core (auth, negotiation, framing)."""
