"""Audio: wav I/O and the wire formats, the compressed formats (encode), voice-clip checks, the mel frontend, the
split RVQ."""
