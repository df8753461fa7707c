"""Measured ideas that are not part of the product: reachable from Python, absent from the CLI and the server."""
